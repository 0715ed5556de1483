"""Which rendered pages become training data: rule filters, then an optional LLM judge.

MultiUI had an LLM read each accessibility tree and drop adult, gambling, violent,
discriminatory and error pages. The rules below catch the obvious cases for free
(so the judge, when configured, sees fewer pages); a dropped page keeps its row
in `pages` with the reason, so the filters can be audited from the shards.

The web is multilingual, so the rules are too: a URL and domain blocklist (transforms/web/
blocklist.py), error and parked-domain phrasings and topic keywords in the most common web
languages, and language identification (transforms/web/language.py) for runs that want, as the
paper's FineWeb source, English pages only. Latin and Cyrillic terms match as whole words;
Chinese, Japanese, Korean, Thai and Arabic terms are specific multi-character phrases matched as
substrings (those scripts do not separate words, or glue particles to them). A topic needs, besides
several of its words, one that only the business itself uses (an offer, a call to action): a news
story on gambling law or a museum's nude drawings names the topic, a casino sells it. Short pages are
also checked for placeholders (for-sale brokers, "coming soon") and sign-in walls. Words are written
per language, so a multilingual encoder (transforms/web/topic_model.py) also judges each page: a
business the words missed, an error or placeholder worded past the phrase lists, and topic words
that sit in a report rather than an offer. The head (title,
meta description and keywords) is judged apart from the visible text, since a hijacked site rewrites
only its head and the title reaches captions: a head that offers what the body does not, or is in
another language, is dropped with a reason of its own. The measured precision and recall on a
labelled set of pages is printed by tests/test_web_curation.py, on held-out sets written blind,
rendered in Chromium, by tests/test_curation_holdout.py, and on hijacked heads by
tests/test_curation_titles.py.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from html import unescape
from typing import Iterable, Optional

from transforms.llm.requests import Completion, Request, Sampling
from transforms.web import blocklist, head, language, topic_model
from transforms.io.ids import stable_id


def terms(words: Iterable[str]) -> re.Pattern:
    """One case-insensitive pattern: whole words for spaced scripts, substrings for dense ones.
    A term may be a regular expression (its letters are not escaped). Consecutive spaced terms share
    one word-boundary test (`(?<!\w)(?:a|b)(?!\w)` matches what `(?<!\w)a(?!\w)|(?<!\w)b(?!\w)`
    does, in the same order): the engine tries the alternatives only where a word starts, which made
    a page's topic words 4x cheaper to count."""
    runs: list[tuple[bool, list[str]]] = []
    for word in words:
        dense = bool(language.DENSE_CHAR.search(word))
        if runs and runs[-1][0] == dense:
            runs[-1][1].append(f"(?:{word})")
        else:
            runs.append((dense, [f"(?:{word})"]))
    parts = ["|".join(run) if dense else rf"(?<!\w)(?:{'|'.join(run)})(?!\w)" for dense, run in runs]
    return re.compile("|".join(parts), re.I)


# -- error pages ------------------------------------------------------------------------------------
# A title that *starts* with one of these is an error page (generic words: only at the start).
ERROR_TITLES = re.compile(
    # ... except one that starts with "error codes": an appliance's or a program's list of them
    r"^(?!\s*(error|erro|errore|erreur|fehler|hata|エラー|错误|錯誤|오류)\s*(codes?\b|códigos?|codici|kod\w*|コード|代码|代碼|코드))"
    r"\s*(\d{3}\b|error\b|not found|page not found|access denied|forbidden|service unavailable|"
    r"bad gateway|internal server error|site can.t be reached|this page isn.t working|"
    r"just a moment|attention required|are you a robot|oops\b|whoops\b|fehler\b|erreur\b|errore\b|"
    r"erro\b|ошибка\b|błąd\b|hata\b|fout\b|エラー|错误|錯誤|오류|خطأ|"
    r"welcome to nginx|apache2? .*default page|index of /|it works!|test page for|iis windows server|"
    r"account suspended|website (is )?(temporarily )?unavailable)", re.I)
# Specific phrasings of "page not found / does not exist / access denied": anywhere in the title or
# a heading, or in the text of a short page (a soft 404: the server said 200 but the page says 404).
ERROR_PHRASES = terms([
    # en
    r"page not found", r"(page|file|url|document)s? (you )?(requested |are looking for |were looking for )?"
    r"(could not|cannot|can.t|couldn.t) be found", r"(page|file) (does not|doesn.t|no longer) exists?",
    r"the requested url .{0,80} was not found", r"404 (not found|error|page)", r"error 404", r"file not found",
    r"this page (isn.t|is not) available", r"(this )?account has been suspended", r"nothing (was )?found here",
    r"(we|i) (can.t|cannot|couldn.t|could not) (seem to )?find (that|this)(?! \w)",
    r"(we|i) (can.t|cannot|couldn.t|could not) (seem to )?find (the|that|this|your) (page|url|link|product|item|file)s?",
    r"the (page|link|url|product|item) you.(re|are|were) (looking|searching) for ([\w'’]+ ){0,4}"
    r"(moved|removed|deleted|exists?|available|found|changed|expired|wandered)",
    r"(this|that|the) (page|link|product) (has been|was|may have been|might have been) (moved|removed|deleted)",
    # es
    r"página no encontrada", r"no se (ha )?(pudo )?encontr(ó|ar|ado) la página", r"la página (que buscas|"
    r"solicitada|que está buscando|que estás buscando)? ?no existe", r"error 404", r"página no disponible",
    # de
    r"seite nicht gefunden", r"die (angeforderte |gesuchte )?seite (wurde )?(konnte )?nicht gefunden",
    r"seite (existiert nicht|nicht verfügbar)", r"fehler 404", r"zugriff verweigert", r"datei nicht gefunden",
    # fr
    r"page (introuvable|non trouvée|inexistante)", r"la page (demandée |que vous recherchez |que vous cherchez )?"
    r"(n.existe pas|est introuvable|n.a pas été trouvée)", r"erreur 404", r"accès refusé",
    r"cette page n.existe pas",
    # pt
    r"página não (encontrada|existe)", r"página inexistente", r"erro 404", r"acesso negado",
    r"a página (que você procura |solicitada )?não (foi encontrada|existe)",
    # it
    r"pagina non (trovata|esiste|disponibile)", r"errore 404", r"accesso negato", r"pagina inesistente",
    # nl, pl, tr, id, vi, sv
    r"pagina niet gevonden", r"nie znaleziono strony", r"strona nie (została znaleziona|istnieje)", r"błąd 404",
    r"sayfa bulunamadı", r"halaman tidak ditemukan", r"không tìm thấy trang", r"sidan (kunde inte hittas|hittades inte)",
    r"akun (hosting )?(ini )?(telah |sudah )?(ditangguhkan|dinonaktifkan)",
    r"tài khoản (hosting )?(này )?(đã )?bị (tạm )?(khóa|khoá|đình chỉ|ngưng)",
    # ru, uk
    r"страница не найдена", r"страница не существует", r"ошибка 404", r"доступ (запрещен|запрещён)",
    r"запрашиваемая страница не (найдена|существует)", r"сторінку не знайдено", r"сторінка не знайдена",
    # zh (simplified and traditional)
    "页面不存在", "页面未找到", "找不到页面", "找不到网页", "网页不存在", "页面找不到", "页面没有找到", "访问的页面不存在",
    "页面已删除", "页面已被删除", "404错误", "错误404", "出错了", "服务器错误", "頁面不存在", "找不到頁面",
    "找不到網頁", "網頁不存在", "頁面未找到", "您要找的页面", "您访问的页面",
    # ja
    "ページが見つかりません", "ページは見つかりませんでした", "ページが存在しません", "お探しのページ", "アクセスできません",
    "404エラー", "ファイルが見つかりません",
    # ko
    "페이지를 찾을 수 없습니다", "페이지를 찾을 수 없음", "페이지가 존재하지 않습니다", "존재하지 않는 페이지", "요청하신 페이지",
    "(게시글|게시물|글|상품|제품|문서)(을|를|이|가) 찾을 수 없습니다", "접근이 거부", "오류가 발생했습니다",
    # ar
    "الصفحة غير موجودة", "لم يتم العثور على الصفحة", "خطأ 404", "الصفحة المطلوبة غير موجودة",
    # th
    "ไม่พบหน้า",
])
# Soft 404s of content that is gone rather than never there: a removed article or product, an expired
# ad or job offer, a deleted forum topic. Judged in the title and headings only (where such a page
# says it, above its site's menus and suggestions), and like the phrases above not on an article.
GONE_PHRASES = terms([
    # en
    r"(is|are) no longer available", r"(has|have) been (removed|deleted|taken down|unpublished)",
    r"(listing|ad|advert|job|offer|vacancy|posting|topic|thread|post|article|product|item) (has )?expired",
    r"(topic|thread|post|article|listing) (does not|doesn.t) exist",
    # es, pt
    r"ya no está disponible", r"(ha sido|fue) (eliminad|retirad|borrad)[oa]", r"no existe o (ha sido|fue) eliminad",
    r"(anuncio|oferta|vacante) (ha )?(caducado|expirado|finalizado)", r"já não está disponível",
    r"não está mais disponível", r"(foi|foram) (removid|excluíd|apagad)[oa]s?",
    r"(anúncio|vaga|oferta|tópico) (encerrad|expirad|removid)[oa]", r"(tópico|anúncio|produto) não encontrad[oa]",
    # de, fr, it, nl
    r"nicht mehr verfügbar", r"(wurde|wurden) (gelöscht|entfernt)", r"(anzeige|stellenanzeige|angebot) (ist )?abgelaufen",
    r"n.est plus disponible", r"(a|ont) été (supprimée?s?|retirée?s?)", r"(annonce|offre) (a )?expirée?", r"n.existe plus",
    r"non è più disponibile", r"(è stato|è stata) (rimoss|eliminat|cancellat)[oa]", r"(annuncio|offerta) scadut[oa]",
    r"non esiste più", r"niet meer beschikbaar", r"(is|zijn) verwijderd", r"bestaat niet( meer)?",
    r"(vacature|advertentie) (is )?verlopen",
    # pl, tr, ru, vi, id
    r"już niedostępn[aey]", r"nie jest już dostępn[aey]", r"(zostało|została|został) usunięt[aey]",
    r"(ogłoszenie|oferta) (wygasł[oa]|zakończon[aey])", r"artık (mevcut|yayında) değil", r"yayından kaldırıl\w*",
    r"(ilan|içerik) (kaldırıldı|silindi|sona erdi)", r"(konu|başlık|ilan|ürün|içerik|mesaj) bulunamadı", r"больше не (доступ\w*|существует)", r"снят\w* с публикации",
    r"(объявление|вакансия|тема|статья|товар) (был[аои]? )?(удален\w*|удалён\w*|снят\w*|не найден\w*)",
    r"не существует", r"không (còn )?tồn tại", r"đã bị (xóa|xoá|gỡ)", r"không còn khả dụng",
    r"tidak (lagi )?tersedia", r"(telah|sudah) dihapus", r"tidak ditemukan",
    r"(ogłoszenie|oferta|strona) (jest )?(już )?nieaktualn\w*",
    # zh, ja, ko, ar
    "不存在或已被删除", "已被删除", "已被刪除", "已下架", "帖子不存在", "主题不存在", "主題不存在", "文章不存在",
    "削除されました", "掲載終了", "公開終了", "販売終了", "삭제되었습니다", "삭제된 게시물", "판매가 종료", "존재하지 않는",
    "تمت إزالة", "تم حذف", "لم يعد متاح",
])
# A page whose text is shorter than this (effective characters) and carries an error phrase anywhere
# is an error page; longer pages only when the phrase is in the title or a heading.
SOFT_404_CHARS = 800
# up to here a page's opening text may be an error or parked page's, wrapped in its site's menus,
# footers and offers: the topic model's kinds judge it at topic_model.KIND_SURE; past it, only its
# title and headings, together and alone (measured: docs/papers/multiui.md)
KIND_PAGE_CHARS = 2000

# -- parked and for-sale domains --------------------------------------------------------------------
PARKED = terms([
    r"this domain (name )?(is|may be) for sale", r"buy this domain", r"domain is parked", r"parked free",
    r"parkingcrew", r"sedoparking", r"hugedomains", r"this domain (has been|is) registered (by|at|with)",
    r"the domain .{1,80} (is|may be) for sale", r"domain (name )?for sale", r"make an offer on this domain",
    r"diese domain (steht zum verkauf|ist zu verkaufen|kaufen|wurde registriert)", r"domain kaufen",
    r"ce (nom de )?domaine est (à vendre|en vente)", r"nom de domaine à vendre",
    r"este dominio (está|puede estar) (a la venta|en venta)", r"dominio en venta",
    r"este domínio (está|pode estar) à venda", r"domínio à venda",
    r"questo dominio è in vendita", r"dominio in vendita", r"dit domein is te koop", r"domena na sprzedaż",
    r"(этот )?домен прода[её]тся", r"продажа домена",
    "该域名正在出售", "此域名出售", "本域名出售", "域名出售", "域名转让", "域名正在出售", "該域名", "域名出售中",
    "このドメインは売り物です", "このドメインは販売中", "ドメイン売却", "このドメインを購入",
    "도메인 판매", "이 도메인은 판매", "هذا النطاق للبيع", r"(اسم )?(النطاق|الدومين) (معروض )?للبيع",
    r"ta domena (jest (wystawiona )?na sprzedaż|została zarejestrowana)", r"deze domeinnaam is te koop",
    r"bu (alan adı|domain) (satılıktır|satılık|satıştadır|satışta)", r"satılık (alan adı|domain)",
    r"(nama )?domain ini (sedang )?(dijual|telah terdaftar|sudah terdaftar)", r"beli domain ini",
    r"tên miền này (có thể )?(đang được|đã được) (rao bán|bán|chuyển nhượng|đăng ký)",
    r"tên miền (đang được|đang) (rao bán|bán|chuyển nhượng)", r"(hỏi )?mua tên miền này",
    r"ce (nom de )?domaine (est peut-être|pourrait être) à vendre", r"этот домен (может быть )?(прода[её]тся|продан)",
    # a registrar's page for a domain its owner let expire
    r"this domain (name )?(has )?expired", r"ce (nom de )?domaine a expiré", r"este dominio ha (expirado|caducado)",
    r"este domínio expirou", r"diese domain ist abgelaufen", r"questo dominio è scaduto",
    r"ta domena wygasła", r"dit domein is verlopen", r"bu alan adının süresi (doldu|dolmuştur)",
    r"срок (регистрации|действия) этого домена (истёк|истек)", r"этот домен (истёк|истек)", r"tên miền này đã hết hạn",
    r"domain ini (telah|sudah) kedaluwarsa",
])
# A link farm's "related searches", trusted only on the page of a domain that names itself and nothing
# else (is_link_farm): a parking service's page, at any length
RELATED_SEARCHES = terms([
    r"related searches", r"recherches associées", r"búsquedas relacionadas", r"pesquisas relacionadas",
    r"verwandte suchanfragen", r"ricerche correlate", r"powiązane wyszukiwania", r"gerelateerde zoekopdrachten",
    r"ilgili aramalar", r"похожие запросы", r"tìm kiếm liên quan", r"pencarian terkait",
    "相关搜索", "相關搜尋", "関連検索", "관련 검색", "عمليات بحث ذات صلة",
    # or its sponsored links
    r"sponsored (links|listings)", r"related links", r"liens (sponsorisés|commerciaux)", r"enlaces patrocinados", r"links patrocinados",
    r"gesponserte links", r"link sponsorizzati", r"linki sponsorowane", r"gesponsorde links",
    r"sponsorlu (bağlantılar|linkler)", r"спонсорские ссылки", r"liên kết (được )?tài trợ", r"tautan (ber)?sponsor",
    "赞助链接", "贊助連結", "スポンサーリンク", "스폰서 링크", r"روابط (دعائية|ممولة)",
])
# Weaker signs of a registrar's or broker's placeholder, trusted only on a short page (under SOFT_404_CHARS):
# a broker lists "similar domains for sale"; a registrar's default page is the "future home of" a site.
PARKED_SHORT = terms([
    r"domains? (names? )?(are |is )?for sale", r"future home of", r"is this your domain",
    r"domain (name )?(registered|reserved) (and hosted )?(by|at|with)", r"get your own domain",
    r"this (site|domain|page|web ?page) (is|has been) parked", r"dominios? en venta", r"domains? zu verkaufen",
    r"domaines? à vendre", r"domínios? à venda", r"domini in vendita",
])
# What a parked or freshly registered domain's page is about, in any language: itself. A short page
# (under SOFT_404_CHARS) whose title or a heading names its own host, and whose text speaks of a
# "domain", is a registrar's or broker's page for that domain, however it words the sale or the
# registration (phrases are endless; the structure is the same in every language). The one word it
# needs, "domain", in the languages a crawl holds most:
DOMAIN_WORDS = terms([
    r"domains?", r"domena", r"domeny", r"domaine", r"dom[ií]nios?", r"domeinnaam", r"domein", r"домен\w*",
    r"alan adı", r"tên miền", "ドメイン", "域名", "網域", "도메인", "نطاق", "النطاق", "دومين",
])


_SAME_QUOTES = "\""                    # opens and closes alike
_OPENING_QUOTES = "“„«‘‚「『‹"
_CLOSING_QUOTES = "”»’」』›"
_SENTENCE_STOP = re.compile(r"[.!?。！？\n]\s")
QUOTE_REACH = 80


def names_a_quoted_term(text: str, start: int) -> bool:
    """Whether the word at `start` opens a quotation (a quote mark right before it): a term quoted as
    a term ("slot gacor" ads), which a page that offers it does not do. Not `quoted`: a brand
    quoted whole ("Royal Vegas Casino") still offers what it names."""
    before = text[max(0, start - 3):start].rstrip()
    return bool(before) and before[-1] in _SAME_QUOTES + "'" + _OPENING_QUOTES


def _quotations(text: str):
    """(start, end, closed) of each quotation in `text`: from its opening mark to past its closing one,
    or to the end of `text` where none closes it; one left open for QUOTE_REACH characters is none."""
    opener = None
    for i, ch in enumerate(text):
        if opener is None:
            if ch in _OPENING_QUOTES or ch in _SAME_QUOTES:
                opener, start = ch, i
        elif ch in _CLOSING_QUOTES or ch in _SAME_QUOTES or (opener == "„" and ch == "“"):
            yield start, i + 1, True
            opener = None
        elif i - start > QUOTE_REACH:
            opener = None
    if opener is not None:
        yield start, len(text), False


def quoted(text: str, start: int) -> bool:
    """Whether the words at `start` stand inside a quotation: a quote opened before them in the same
    sentence (QUOTE_REACH characters back at most) and not closed again ('Site shows "This domain is
    parked" after I moved', « Ce domaine a expiré »)."""
    before = _SENTENCE_STOP.split(text[max(0, start - QUOTE_REACH):start])[-1]
    return any(not closed for _, _, closed in _quotations(before))


def unquoted(text: str) -> str:
    """`text` with what it quotes cut out (its closed quotations): the page's own words, which the
    model judges. A help thread titled 'Site shows "This domain is parked" after I moved' reports a
    parking page; it is not one."""
    for a, b, closed in reversed(list(_quotations(text))):
        if closed:
            text = text[:a] + "…" + text[b:]
    return text


def says(pattern: re.Pattern, text: str) -> bool:
    """Whether `text` says `pattern` itself, not as a quotation: a page that explains what “this domain
    is for sale” means quotes the phrase; the page that says it does not."""
    return any(not quoted(text, m.start()) for m in pattern.finditer(text))


def _own_host(url: str) -> str | None:
    """The page's host name without www., or None where it is no domain name (a bare word)."""
    host = blocklist.host_of(url).removeprefix("www.")
    return host if "." in host else None


def asks(title: str) -> bool:
    """Whether the title's first part (before its site's name) is a question: a help article or a
    forum thread about a thing ("What happens when a domain expires?"), not the thing."""
    return bool(re.match(r"[^|–—·]*[?？]", title or ""))


def names_its_own_domain(url: str, flat: str, title: str, heads: list[str]) -> bool:
    """The page's title or a heading holds its own host name (without www.), and its text a word for
    "domain": what a parking, for-sale or not-yet-built page of a registrar looks like."""
    host = _own_host(url)
    if host is None or not DOMAIN_WORDS.search(flat):
        return False
    return any(host in field.lower() for field in [title, *heads])


# A price list (three prices or more: a host's plans, a shop's products) is an offer of the site's own,
# which the head, on a short page, reads as a placeholder when the offer is hosting or domains. A
# product's price beside its old one (two prices) is an offer too, which the head, on a short shop
# page, reads as an error page at its likely threshold: such a page is one only where it is sure.
PRICE_LIST = 3
OFFER_PRICES = 2
_CURRENCY = (r"(?:€|\$|£|¥|₩|₫|đ|zł|TL|₺|руб\.?|₽|Rp\.?|R\$|kr|CHF|EUR|USD|GBP|PLN|TRY|VND|IDR|원|円|元|"
             r"ريال|درهم|دينار|ج\.م)")
_PRICE = re.compile(rf"{_CURRENCY}\s?\d[\d.,\s]*\d|\d[\d.,]*\s?{_CURRENCY}(?!\w)", re.I)


def prices(flat: str) -> int:
    return len(_PRICE.findall(flat))


OPENING_CHARS = 400
_EMAIL = re.compile(r"\S+@\S+")


def names_its_host(url: str, flat: str, title: str, heads: list[str]) -> bool:
    """The page's own host name (without www.) is in its title, a heading or its opening
    OPENING_CHARS characters, outside an e-mail address (True where the URL has no domain name to
    look for). A parked page is about its domain ("example.com is for sale", "example.com has been
    registered"); a registrar's or host's product page speaks of domains in general and names its
    own, if at all, in its footer or its e-mail address."""
    host = _own_host(url)
    if host is None:
        return True
    return host in _EMAIL.sub(" ", flat[:OPENING_CHARS]).lower() or any(host in f.lower() for f in [title, *heads])


def is_link_farm(url: str, flat: str, title: str, heads: list[str]) -> bool:
    """A parking service's page of "related searches": its title or a heading is its own host name
    alone, or with those words ("example.com - Related searches"). A shop titled with its name
    ("Example.com: Running shoes") that lists its own related searches is not one."""
    host = _own_host(url)
    if host is None or not RELATED_SEARCHES.search(flat):
        return False
    for field in [title, *heads]:
        field = field.lower()
        if host in field:
            rest = RELATED_SEARCHES.sub(" ", field.replace(host, " "))
            if not re.sub(r"[\W_]+", "", rest):
                return True
    return False


# A short page that only says the site is not there yet (or not at the moment), whatever it is called:
# "site under construction", "down for maintenance", "we'll be back shortly". Not there yet is a
# placeholder of its domain (parked); down for maintenance (MAINTENANCE) is an error page served as
# a page. The bare words ("Coming soon") only count as the title or a heading: in a sentence they
# may be about a product.
PLACEHOLDER_HEADINGS = re.compile(r"^\W*(coming soon|launching soon|under (construction|maintenance)|"
                                  r"(site|website) (coming soon|under construction|under maintenance))\b", re.I)
PLACEHOLDER = terms([
    r"(site|website|web ?page|page|shop|store|blog) (is |will be )?(coming soon|launching soon|under construction|"
    r"under maintenance|down for maintenance)", r"down for (scheduled )?maintenance",
    r"check back (soon|later|shortly)",
    r"(we.re|we are|we.ll|we will|will) be back (soon|shortly|online)",
    r"doing (some )?(work|maintenance) on (the|our|this) (site|website)",
    r"(new )?(site|website) (is )?on (its|the) way", r"demnächst (verfügbar|online)",
    r"in kürze (verfügbar|online|wieder)",
    r"(seite|website|webseite) (ist )?(im aufbau|in wartung)",
    r"wartungsarbeiten", r"(sitio|página|web) en (construcción|mantenimiento)", r"próximamente",
    r"site en (construction|maintenance)", r"bientôt (disponible|en ligne)",
    r"(site|página) em (construção|manutenção)",
    r"sito (in costruzione|in manutenzione)", r"сайт (находится )?(в разработке|на реконструкции|на обслуживании)",
    r"sitede bakım", r"situs (sedang )?dalam (perbaikan|pemeliharaan)", r"trang web đang (xây dựng|bảo trì)",
    "网站建设中", "网站维护中", "正在建设中", "網站建置中", "準備中", "工事中", "メンテナンス中", "공사중", "준비중", "점검중",
])

MAINTENANCE = terms([
    r"maintenance", r"be back (soon|shortly|online)", r"doing (some )?work on", r"wartung\w*", r"mantenimiento",
    r"manutenção", r"manutenzione", r"(на )?обслуживании", r"bakım\w*", r"perbaikan", r"pemeliharaan", r"bảo trì",
    "维护", "維護", "メンテナンス", "점검",
])


# A title (its part before the site's name) or a heading that is only the notice that the site is down
# for maintenance ("Boutique en maintenance", "Trwa przerwa techniczna"): at any length, in the site's
# chrome, an error page. The whole field must be the notice: a news headline about a bank's
# maintenance says more ("Przerwa techniczna w systemie banku w nocy").
MAINTENANCE_NOTICE = re.compile(r"(?:" + "|".join([
    r"(?:(?:our|the) )?(?:site|website|shop|store) (?:is )?(?:currently |temporarily )?"
    r"(?:down for|under|undergoing|in) (?:scheduled )?maintenance", r"(?:scheduled )?maintenance in progress",
    r"we(?:'re| are) (?:currently )?(?:down for|undergoing|performing|doing) (?:some )?(?:scheduled )?maintenance",
    r"(?:notre |le |la )?(?:site|boutique) (?:est )?(?:actuellement |temporairement )?en (?:cours de )?maintenance",
    r"(?:(?:unsere|die) )?(?:seite|website|webseite|shop|onlineshop) (?:ist )?(?:gerade |derzeit |vorübergehend )?"
    r"(?:in|im) wartung(?:smodus)?", r"wartungsarbeiten",
    r"(?:(?:el|la|nuestra|nuestro) )?(?:sitio|tienda|web|página)(?: web)? (?:está )?en mantenimiento",
    r"estamos en mantenimiento",
    r"(?:il |il nostro |lo )?(?:sito|negozio|shop) (?:è )?(?:temporaneamente )?in manutenzione", r"manutenzione in corso",
    r"(?:o |a |nossa |nosso )?(?:site|loja) (?:está )?em manutenção", r"estamos em manutenção",
    r"(?:onze |de )?(?:website|webshop|site|winkel) (?:is )?(?:tijdelijk )?in onderhoud", r"we zijn (?:even )?in onderhoud",
    r"(?:trwa )?przerwa techniczna", r"(?:sklep|strona|serwis) w trakcie prac technicznych",
    r"(?:sitemiz|mağazamız|site) bakımda", r"bakım çalışması",
    r"(?:сайт|магазин) (?:временно )?на (?:техническом )?обслуживании", r"(?:ведутся|проводятся) технические работы",
    r"(?:website |trang web |cửa hàng )?đang (?:được )?bảo trì", r"(?:situs|website|toko) sedang (?:dalam )?"
    r"(?:perbaikan|pemeliharaan|maintenance)",
    r"(?:网站|系统|系統|網站)?(?:维护|維護)中", r"(?:ただいま)?(?:サーバー|システム)?メンテナンス中", r"(?:서버|시스템|사이트) ?점검 ?중",
    r"(?:الموقع )?(?:قيد|تحت) الصيانة",
]) + r")", re.I)
_TITLE_PARTS = re.compile(r"\s+[|–—·-]\s+")


def maintenance_notice(title: str, heads: list[str]) -> bool:
    """The title's first part or a heading is only the notice that the site is down for maintenance."""
    fields = [_TITLE_PARTS.split(title or "")[0], *heads]
    return any(MAINTENANCE_NOTICE.fullmatch(f.strip(" \t!.…:。！")) for f in fields if f)


# -- sign-in walls ----------------------------------------------------------------------------------
# A sign-in wall is thin: the content is behind it. A short page (under SOFT_404_CHARS) that says the
# content needs a sign-in ("You must be signed in to view this page") is one; so is a page with a
# password field and little else: a sign-in form's own labels, buttons and links ("Email", "Password",
# "Keep me signed in", "Forgot password?") are about SIGN_IN_FORM_CHARS, so such a page needs
# min_text_chars beyond them. (A sign-in page that also tells what the account is for is kept: a form
# is a fine UI example when there is text around it.)
SIGN_IN_FORM_CHARS = 200
PASSWORD_NAMES = terms([
    "password", "passwort", "contraseña", "mot de passe", "senha", "пароль", "wachtwoord", "hasło", "şifre",
    "kata sandi", "mật khẩu", "lösenord", "passord", "adgangskode", "salasana", "heslo", "jelszó", "parolă",
    "密码", "密碼", "パスワード", "비밀번호", "كلمة المرور", "รหัสผ่าน",
])
_PASSWORD_INPUT = re.compile(r"<input\b[^>]*\btype\s*=\s*[\"']?password\b", re.I)
SIGN_IN_WALL = terms([
    r"(you must|you need to|you have to|please) (be )?(signed|logged|sign|log) ?(in|on) (to|before) "
    r"(view|see|access|continue|read)",
    r"(sign|log) ?in to (continue|view this|access this|see this|read this)",
    r"(melden sie sich|bitte) an,? um", r"inicia sesión para (continuar|ver|acceder)",
    r"connectez-vous pour (continuer|voir|accéder)",
    r"faça login para (continuar|ver|acessar)", r"accedi per (continuare|vedere)", r"войдите,? чтобы", "请登录后", "登录后查看",
    "ログインしてください", "로그인이 필요",
])


# A form with fields to fill (a contact, booking or sign-in form) is a page of its own: a short one is
# not an error page or a placeholder for the model's kinds, which read such pages so (a farm stay's
# availability request, a printer's contact form). An error page's one search box, a placeholder's
# one e-mail box for news of the launch, are one field.
FORM_FIELDS = 2
_FILL_ROLES = ("textbox", "combobox", "spinbutton")
_FILL_INPUT = re.compile(r"<(textarea|select)\b|<input\b(?![^>]*\btype\s*=\s*[\"']?"
                         r"(hidden|submit|button|checkbox|radio|image|reset|search)\b)", re.I)


def form_fields(page: dict) -> int:
    """How many fields the page asks a reader to fill in: textboxes, lists and numbers of its tree,
    or of its HTML (a row without a tree), not search boxes or buttons."""
    in_tree = sum(1 for n in page.get("nodes") or () if n.get("role") in _FILL_ROLES)
    return max(in_tree, len(_FILL_INPUT.findall(page.get("html") or "")))


def has_password_field(page: dict) -> bool:
    """A password box in the tree (a textbox named so, in the common web languages) or in the HTML."""
    if any(n.get("role") == "textbox" and PASSWORD_NAMES.search(n.get("name") or "") for n in page.get("nodes") or ()):
        return True
    return bool(page.get("html") and _PASSWORD_INPUT.search(page["html"]))

# -- topics -----------------------------------------------------------------------------------------
# A hit count alone cannot tell a casino from a news story about casinos: both say "online slots" ten
# times. So each topic's vocabulary is split in two:
#   intent: what only the business itself says to its customers (offers and calls to action: "free
#     spins", "bet slip", "bono de bienvenida"; adult sites' product words and boilerplate: "porn",
#     "cam2cam", "discreet billing", the US 2257 record-keeping statement; the names of illegal
#     lottery and toto products), and
#   topical: words a reporter, a museum, a health service or an encyclopedia also uses ("casino",
#     "online slots", "bookmakers", "nude", "escort", "erotic").
# A page is about a topic when at least `min_hits` terms of it occur and at least one of them is an
# intent term: reporting, art and health pages keep any number of topical words. Terms are specific
# (Spanish "sexo" is a form's gender field, Korean 성인 is "adult education", "pussy willow" is a flower,
# "strip" is a comic or a steak): ordinary words appear only inside longer phrases.
TOPICS = {
    "adult": {
        "intent": (
            # en
            "porn", "porno", "pornos", "porns", "xxx", "nsfw", "hentai", "camgirls?", "cam girls?", "cam boys?",
            "cam models?", "webcam models?", "sex ?cams?", "live sex", "sex chat", "cam2cam",
            "adult videos?", "sex videos?", "free porn", "pornstars?", "porn stars?", "milfs?",
            "cumshots?", "creampies?", "blowjobs?", "gangbangs?", "18 ?u\\.?s\\.?c\\.? ?(§ ?)?2257",
            "discreet billing", "hot singles", "fuck buddy", "sex dating", "xvideos", "onlyfans leaks?",
            # es
            r"v[ií]deos? (porno|de sexo|x)", "putas", "follando", "chicas desnudas", "sexo gratis",
            r"sexo (en vivo|en directo|casero|amateur)", "contactos? (para adultos|sexuales|calientes)",
            "encuentros? sin compromiso", "encuentros? (sexuales|calientes)", "facturación discreta",
            "webcams? (porno|eróticas?|de sexo)",
            # pt
            "pornô", "putaria", "mulheres nuas", r"v[ií]deos? de sexo", r"sexo (grátis|ao vivo|amador)",
            "garotas de programa", "encontros? (casuais|sexuais)",
            # de
            "sexfilme?", "sexkontakte", "erotikfilme?", "sextreffen", "ficken", "titten", "sexcams?",
            # fr
            r"vidéos? (porno|de sexe|x)", "sexe gratuit", "salopes?", "plan cul", "rencontres? sexe", "films? x",
            "sexe amateur", "webcams? sexe", "cam coquine",
            # it
            "video di sesso", "sesso gratis", "troie", "film porno", "incontri (per adulti|di sesso|hot)",
            # ru
            "порно", "порнуха", "секс видео", "проститутки", "шлюхи", "индивидуалки",
            "интим[ -]?(услуги|досуг|знакомства)",
            "секс знакомства", "массаж с продолжением", "снять девушку", "досуг для взрослых",
            # id
            "bokep", "video mesum", "cerita (dewasa|sex|seks)", "situs dewasa", "ngentot", "memek",
            # vi
            "phim sex", "phim (người lớn|cấp 3|heo)", "(video|clip) người lớn", "clip sex", "gái gọi", "phim khiêu dâm",
            # tr
            "sikiş", r"seks (videoları|izle|filmi)", "porno izle", "sex izle", "escort (bayan|kız)",
            # zh
            "成人视频", "成人影片", "成人影院", "成人网站", "黄色网站", "黄色视频", "黄片", "无码", "有码", "激情视频",
            "自拍偷拍", "国产自拍", "三级片", "裸聊", "约炮", "乱伦", "亚洲色图", "av女优", "av在线", "日韩av", "成人電影",
            "無碼", "情色網", "一本道", "成人漫画", "宅男福利", "福利视频", "福利姬", "午夜影院", "草榴", "成人影音",
            # ja
            "アダルト動画", "エロ動画", "無修正", "av女優", "エロ画像", "アダルトサイト", "エロ漫画", "エロ同人", "ハメ撮り",
            "中出し", "デリヘル", "ソープランド",
            # ko
            "야동", "무료야동", "성인영상", "성인사이트", "성인방송", "포르노", "조건만남", "출장안마", "야설", "벗방",
        ),
        "topical": (
            # en
            "nude", "nudes", "naked", "nudity", "escort", "escorts", "erotic", "erotica", "fetish", "bdsm",
            "hardcore", "striptease", "strip ?shows?", "strip clubs?", "private shows?", "hookups?", "adults? only",
            "busty", "squirting", "hotwife", "sexually explicit", "sexting", "adult dating", "sex tapes?",
            "lingerie models?", "(free|tip|buy) tokens", "models online",
            # es, pt, it, fr, de
            "desnud[oa]s?", r"er[oó]tic[oa]s?", "contenido para adultos", "parejas liberales", "sin censura",
            "amantes? discret[oa]s?", "acompanhantes", "nuas?", "conteúdo adulto", "nudi", "erotic[oiae]",
            "escorte?s?", "coquines?", r"érotiques?", "libertins?", "nackte?", "huren", "erotik", "bordell",
            # ru
            "эротика", "эротический массаж", "эскорт", "стриптиз", "бдсм", "для взрослых", "массажистки",
            "анкеты девушек",
            # id, vi, tr
            "telanjang", "mesum", "khiêu dâm", "çıplak", "erotik",
            # an adult site's age gate in the languages outside the encoder's ("I am 18", "adult content")
            r"(tôi )?đã đủ 18 tuổi", r"nội dung (dành cho )?người lớn", r"(saya )?sudah berusia 18 tahun",
            "konten dewasa",
            # zh
            "色情", "偷拍", "做爱", "性爱", "情色", "色情網站", "做愛", "性愛", "人妻", "少妇", "自慰", "美女直播", "裸体",
            "成人内容", "成人內容", "限制级", "限制級",
            # ja
            "セックス", "出会い系", "人妻", "熟女", "巨乳", "アダルトコンテンツ", "風俗", "痴漢",
            # ko
            "섹스", "몰카",
        ),
    },
    "gambling": {
        "intent": (
            # en
            "free spins", "bonus spins", "(no )?deposit bonus(es)?",
            r"(welcome|sign ?up|first deposit|match|reload|casino) bonus(es)?",
            r"claim (your )?(bonus|free spins|free bets?)", "free bets?", "bet slip", "bet builder",
            r"place (your|a) bets?", "bet now", r"bet [£$€]?\d+,? (and )?get", r"(odds|price) boosts?",
            r"min(imum)?\.? odds", "wagering requirements?", "real money (casino|slots|games|play)", "play slots",
            r"(mega|free|video|real money) slots", "deposit (now|today)", "exclusive bonus(es)?",
            # es
            "bono de bienvenida", "giros gratis", "tiradas gratis", "bono sin depósito", "apuestas? gratis",
            r"apuesta (ya|ahora)", "primer depósito",
            # pt
            "rodadas grátis", "giros grátis", "bônus de boas-vindas", "bônus sem depósito", r"aposte (já|agora)",
            "aposta grátis", "primeiro depósito",
            # it
            "giri gratis", "bonus senza deposito", "bonus di benvenuto", r"scommetti (ora|subito)",
            # fr
            "tours gratuits", "bonus sans dépôt", "bonus de bienvenue", r"pariez (dès )?maintenant",
            # de
            "freispiele", "bonus ohne einzahlung", "willkommensbonus", "einzahlungsbonus", "gratiswetten?",
            "wettbonus", "quotenboost", "jetzt wetten",
            # ru
            "фриспины", "бонус за регистрацию", r"бонус на (первый )?депозит", "бездепозитный бонус",
            r"делайте ставки", r"играть на (реальные )?деньги",
            # id
            # ("judi online" and "situs judi" are what Indonesian news and sermons call online gambling: topical)
            "slot gacor", "maxwin", r"situs (slot|togel)", r"bandar (togel|judi|bola)",
            r"togel (online|hk|sgp|sdy|hari ini)", r"(deposit|slot) pulsa", "bonus new member", "gampang menang",
            r"judi (slot|bola)", "sbobet", "link alternatif",
            r"prediksi (togel|hk|sgp|sdy)", "angka jitu", r"colok (bebas|macau|naga|jitu)", "paito warna",
            # vi (and the picks of illegal lô đề prediction sites)
            "nhà cái uy tín", "kèo nhà cái", "nổ hũ", "soi kèo", r"(game )?bài đổi thưởng", "khuyến mãi nạp đầu",
            r"soi cầu (lô|xsmb|xsmn|xsmt|miền)", r"(bạch|song) thủ lô", "dàn đề", "lô xiên", r"đánh (lô|đề|lô đề) online",
            r"dự đoán (lô|đề|xsmb|xsmn|xsmt|xổ số)", "lô gan",
            # tr
            "bahis siteleri", "deneme bonusu", "bedava bahis", "yatırım bonusu", "kayıt bonusu", "casino siteleri",
            # zh
            "北京赛车", "时时彩", "幸运飞艇", "真人娱乐", "娱乐城", "彩金", "电子游艺", "网上赌", "網上賭", "娛樂城", "首存",
            "存款优惠", "返水", "立即投注", "快三开奖", "江苏快三",
            # ja
            "入金不要ボーナス", "フリースピン", "初回入金", "入金ボーナス", "登録ボーナス",
            # ko
            "토토사이트", "사설토토", "먹튀", "온라인카지노", "카지노사이트", "바카라사이트", "첫충", "매충", "꽁머니", "슬롯사이트",
        ),
        "topical": (
            # en
            "casino", "casinos", "online slots", "slots online", "slot games?", "slot machines?", "jackpots?",
            "sportsbooks?", "betting odds", "roulette", "poker room", "bookmakers?", "online betting", "baccarat",
            "blackjack", "casino games", "live casino", "in-play", "match betting", "accumulators?", "acca",
            "gambleaware", "begambleaware",
            # es, pt, it, fr, de
            "apuestas", "apuestas deportivas", "casa de apuestas", "tragamonedas", "tragaperras", "ruleta",
            "cassino", "apostas", "apostas esportivas", "casa de apostas", "caça-níqueis", "roleta", "casinò",
            "scommesse", "scommesse sportive", "slot machine", "machines à sous", "paris sportifs", "jeux d.argent",
            "paris en ligne", "spielautomaten", "sportwetten", "spielothek", "buchmacher", "online-casino",
            "wettanbieter", "live-wetten",
            # ru
            "казино", "игровые автоматы", "ставки на спорт", "букмекер", "букмекерская", "букмекерские", "рулетка",
            "джекпот", "игровые слоты", "онлайн казино",
            # id, vi, tr
            "judi", "judi online", "situs judi", "togel", "slot online", "taruhan", "sabung ayam", "cá cược", "cờ bạc", "lô đề", "tài xỉu",
            "kết quả xổ số", "kqxs", r"xs(mb|mn|mt)",
            "bahis", "canlı bahis", "kumar", "rulet",
            # zh
            "赌场", "赌博", "博彩", "六合彩", "百家乐", "老虎机", "彩票投注", "体育投注", "购彩", "投注", "下注", "开奖", "棋牌", "竞彩",
            "賭場", "賭博", "百家樂", "老虎機",
            # ja
            "オンラインカジノ", "カジノ", "パチスロ", "ブックメーカー", "バカラ", "ルーレット", "スロットマシン",
            # ko
            "카지노", "바카라", "스포츠토토", "배팅", "베팅", "슬롯머신", "룰렛",
        ),
    },
    # No business vocabulary to tell apart here: every term counts as intent.
    "violent": {
        "intent": (
            "gore", "beheading", "execution video", "snuff", "mass shooting video", "torture video", "kill yourself",
            "斩首视频", "血腥视频", "砍头", "グロ画像", "処刑動画", "참수 영상", "расчлененка", "видео казни",
        ),
        "topical": (),
    },
}
KEYWORDS = {topic: vocab["intent"] + vocab["topical"] for topic, vocab in TOPICS.items()}
MIN_HITS = 3
# One pattern per topic, intent terms first (at one position the longer business phrase wins over a
# topical word it starts with: "casino bonus" over "casino").
PATTERNS = {topic: terms(words) for topic, words in KEYWORDS.items()}
INTENT = {topic: terms(vocab["intent"]) for topic, vocab in TOPICS.items()}


@functools.lru_cache(maxsize=8)
def topic_hits(*texts: str) -> dict[str, tuple[int, int]]:
    """Per topic: (intent hits, all hits) in the texts together; an intent term in quotation marks is
    a hit but not an offer (news warns of “slot gacor” ads; a casino does not quote itself). Do not
    change the dict: it is cached, for a page's second platform, whose text is usually the first's."""
    out = {}
    for topic, pattern in PATTERNS.items():
        found = [(m.group(0), names_a_quoted_term(text, m.start())) for text in texts for m in pattern.finditer(text)]
        if found:
            out[topic] = (sum(1 for f, q in found if not q and INTENT[topic].fullmatch(f)), len(found))
    return out


# -- the page's text ----------------------------------------------------------------------------------
# The <title> is removed with scripts and styles: page_text adds the title once, itself.
_TAGS = re.compile(r"<(script|style|noscript|template|title)\b.*?</\1\s*>|<!--.*?-->|<[^>]+>", re.S | re.I)
_HEADINGS = re.compile(r"<h[1-3]\b[^>]*>(.*?)</h[1-3]\s*>", re.S | re.I)
_SPACE = re.compile(r"\s+")


def page_text(page: dict) -> str:
    """The title and the visible text of the tree: what a reader of the screenshot sees."""
    return "\n".join([page.get("title") or ""] + _body_lines(page))


def body_text(page: dict) -> str:
    """The visible text without the title: what the page's head is held against."""
    return "\n".join(_body_lines(page))


def _body_lines(page: dict) -> list[str]:
    """The tree's StaticText nodes (a heading's name repeats its StaticText child, so when the tree has
    StaticText only those count); without a tree, the HTML's text."""
    nodes = page.get("nodes") or ()
    static = [n["name"] for n in nodes if n.get("role") == "StaticText" and n.get("name")]
    names = static or [n["name"] for n in nodes if n.get("name")]
    if not names and page.get("html"):
        names = [html_text(page["html"])]
    return names


_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.S | re.I)


def html_title(html: str) -> str:
    """The document's <title>, unescaped and whitespace-collapsed ("" without one): the title of a row
    that has only its HTML."""
    found = _TITLE.search(html)
    return _SPACE.sub(" ", unescape(found.group(1))).strip() if found else ""


def html_text(html: str, limit: int = 200_000) -> str:
    """The text of an HTML document, roughly (tags, scripts and styles removed): the fallback when a
    row has no tree."""
    return _SPACE.sub(" ", unescape(_TAGS.sub(" ", html[:limit]))).strip()


def headings(page: dict) -> list[str]:
    """The page's headings: the tree's, or without a tree the HTML's h1 to h3."""
    nodes = page.get("nodes") or ()
    if not nodes and page.get("html"):
        return [t for t in (html_text(h) for h in _HEADINGS.findall(page["html"][:200_000])) if t]
    return [n["name"] for n in nodes if n.get("role") == "heading" and n.get("name")]


# An article: at least this many paragraphs of at least this many characters
ARTICLE_PARAGRAPHS, ARTICLE_PARAGRAPH_CHARS = 3, 140
_PARAGRAPHS = re.compile(r"<p\b[^>]*>(.*?)</p\s*>", re.S | re.I)


def is_article(page: dict) -> bool:
    """Whether the page is written as an article: ARTICLE_PARAGRAPHS paragraphs of at least
    ARTICLE_PARAGRAPH_CHARS. A title or heading that says "404" or "page not found" drops a page
    unless it is one: a tutorial on HTTP errors or an appliance's error codes says so in its headings
    but writes paragraphs no error page has, even one inside a site's full chrome (on the labelled
    sets 1 to 10 and the English sets, the third-longest paragraph of the 69 error pages those words
    found: at most 122 characters; of the 9 articles about errors: at least 150; counted as written,
    a CJK character one: weighted three, as the length rules weigh them, a Korean news site's 404
    page read as an article)."""
    html = page.get("html") or ""
    if html:
        paragraphs = [html_text(p) for p in _PARAGRAPHS.findall(html[:200_000])]
    else:
        paragraphs = [n["name"] for n in page.get("nodes") or () if n.get("role") == "paragraph" and n.get("name")]
    return sum(1 for p in paragraphs if len(p) >= ARTICLE_PARAGRAPH_CHARS) >= ARTICLE_PARAGRAPHS


# the HTTP errors a page names in its title and headings: an error page names its own, one; a page
# that names two or more (a guide to 404, 410 and 503, a status page's incident history) is about them
HTTP_ERRORS = re.compile(r"(?<!\d)(400|401|403|404|405|408|410|429|500|502|503|504)(?!\d)")


# a list of a device's or a program's error codes names them in its title or a heading: it is their
# manual, not an error
ERROR_CODE_LISTS = terms([
    r"error codes", r"(list|table) of error codes", r"c[óo]digos de erro(r)?", r"codes d.erreur", r"fehlercodes",
    r"codici (di )?errore", r"foutcodes", r"kody błędów", r"hata kodlar\w*", r"коды ошиб\w*", r"таблица ошибок",
    # an appliance's fault codes
    r"fault codes", r"st[öo]rungscodes", r"storingscodes?", r"codes? (de )?panne", r"c[óo]digos de (aver[íi]a|falla|falha)",
    r"codici (di )?guasto", r"kody (usterek|awarii)", r"arıza kodlar\w*", r"коды неисправност\w*",
    r"(bảng|danh sách) mã lỗi", r"(daftar|tabel) kode (error|kesalahan)", "エラーコード.{0,12}(一覧|表)",
    "(错误|故障)代码.{0,8}(大全|表|一览|列表)", "(錯誤|故障)代碼.{0,8}(大全|表|一覽|列表)", "(오류|에러) ?코드.{0,8}(목록|표|모음)",
    "رموز الأخطاء", "أكواد الأخطاء",
])


# a title or heading that says how to fix an error, or when it comes ("after updating PHP"), heads a
# help article or a forum thread about one, not an error page
FIXING_ERRORS = terms([
    r"how (to|do i|can i) (fix|solve|resolve|repair|get rid of)", r"troubleshoot\w*", r"fix(ing|es)? (it|the|an?|this)",
    r"after (updating|upgrading|installing|moving|migrating|changing|switching)",
    r"c[óo]mo (solucionar\w*|resolver\w*|corregir\w*|arreglar\w*)", r"soluci[óo]n(es)?", r"solucionar\w*",
    r"despu[ée]s de (actualizar|cambiar|migrar|instalar|mudar)", r"como (resolver|corrigir)\w*",
    r"depois de (atualizar|mudar|migrar)", r"comment (r[ée]soudre|corriger|r[ée]parer)",
    r"apr[èe]s (la |une )?(mise [àa] jour|migration|installation)", r"beheben", r"wie (behebe|l[öo]se)",
    r"nach (dem |einem )?(update|upgrade|umzug)", r"come (risolver\w*|correggere)",
    r"dopo (l.aggiornamento|la migrazione|aver)", r"hoe los je", r"oplossen", r"na (de |een )?(update|upgrade|verhuizing)",
    r"jak (naprawi[ćc]|rozwi[ąa]za[ćc])", r"po (aktualizacji|migracji|przeniesieniu)",
    r"nas[ıi]l (çözülür|düzeltilir|giderilir)", r"güncelleme(den)? sonra", r"cara (mengatasi|memperbaiki)",
    r"setelah (update|upgrade|pindah|migrasi)", r"c[áa]ch (kh[ắa]c ph[ụu]c|s[ửu]a)",
    r"sau khi (c[ậa]p nh[ậa]t|n[âa]ng c[ấa]p|chuy[ểe]n)", r"как (исправить|решить|устранить)",
    r"после (обновления|установки|переезда|миграции)",
    "怎么解决", "如何解决", "解决方法", "解决办法", "怎麼解決", "如何解決", "解決方法", "解決辦法",
    "(部署|迁移|遷移|升级|升級|更新).{0,20}[后後]",
    "(デプロイ|更新|アップデート|アップグレード|移行|移転|インストール)(すると|したら|した後|後に)",
    "(배포|업데이트|업그레이드|설치|이전|이사) ?(후|하면|했더니|하니)", "対処法", "直し方", "解消方法", "해결 ?방법", "해결법", "해결하는",
    "كيفية (إصلاح|حل)", "حل مشكلة",
])


# a title or heading on making an error page (designing, building, customising a 404 page) heads a
# tutorial about them
ERROR_PAGE_GUIDES = terms([
    r"(design|creat|build|mak|customi[sz])\w* .{0,25}404", r"404 pages",
    r"(progettare|creare|personalizzare) .{0,25}404", r"pagine 404", r"(diseñar|crear|criar|personalizar) .{0,25}404",
    r"p[áa]ginas 404", r"(créer|concevoir|personnaliser) .{0,25}404", r"pages 404", r"(erstellen|gestalten) .{0,25}404",
    r"404-seiten? (erstellen|gestalten|anpassen)", r"(maken|ontwerpen) .{0,25}404", r"404-?pagina.s",
    r"(stworzyć|zaprojektować|zrobić) .{0,25}404", r"404 sayfası (nasıl|oluştur)\w*", r"membuat .{0,25}404",
    r"tạo .{0,25}404", r"(создать|сделать) .{0,25}404",
    "404页面(设计|制作)", "(设计|制作).{0,10}404", "404頁面(設計|製作)", "404ページ(の作り方|を作)", "404 ?페이지 (만들기|디자인)",
])


# "sorry" and its kin: an error page's title or heading apologizes for the missing page
APOLOGIES = terms([
    "sorry", r"we apologi[sz]e", "oops", "lo sentimos", "lo siento", "desculpe", "lamentamos", r"d[ée]sol[ée]e?s?",
    "tut uns leid", "entschuldigung", "hoppla", "spiacenti", "ci dispiace", "excuses", "oeps", "przepraszamy",
    "üzgünüz", "maalesef", "mohon maaf", "maaf", r"r[ấa]t ti[ếe]c", r"xin l[ỗo]i", "извините", "к сожалению",
    "抱歉", "对不起", "對不起", "很遗憾", "很遺憾", "申し訳", "すみません", "죄송", "عذرا", "عذراً", "نأسف",
])


def apologizes(title: str, heads: list[str]) -> bool:
    """A title or heading that says an error or gone phrase and apologizes for it ("Rất tiếc, trang bạn
    tìm kiếm không tồn tại"): the page's own error, even inside a news site's article-like chrome,
    where a tutorial about errors never says sorry in its headings."""
    return any(APOLOGIES.search(t) and (says(ERROR_PHRASES, t) or says(GONE_PHRASES, t)) for t in (title, *heads))


def discusses_errors(title: str, heads: list[str]) -> bool:
    """Whether the title and headings are about errors, not one: they name two or more HTTP errors
    (HTTP_ERRORS), a list of error codes (ERROR_CODE_LISTS), how to fix one (FIXING_ERRORS) or how to
    make an error page (ERROR_PAGE_GUIDES)."""
    return (len({m for field in (title, *heads) for m in HTTP_ERRORS.findall(field)}) >= 2
            or any(p.search(field) for p in (ERROR_CODE_LISTS, FIXING_ERRORS, ERROR_PAGE_GUIDES)
                   for field in (title, *heads)))


def effective_chars(page: dict, text: str) -> int:
    """Visible characters, with a Chinese, Japanese or Korean character counted as three: a word's worth
    (so min_text_chars means about as much text in every script)."""
    chars = page.get("text_chars")
    if chars is None:
        chars = len(text) - len(page.get("title") or "")
    return chars + 2 * len(language.CJK_CHAR.findall(text))


def url_text(url: str) -> str:
    """A URL's words (host and path split on punctuation), for keyword rules."""
    return re.sub(r"[\W_]+", " ", re.sub(r"^[a-z]+://", "", url or "", flags=re.I))


# -- the head ---------------------------------------------------------------------------------------
# A hijacked site keeps its body and rewrites its head (transforms/web/head.py): a title, description or
# keywords that sell sex or betting over a bakery, or spam in another language. Each field is held
# against the visible text on its own. A field that offers a topic (one intent term: a head is too short
# for min_hits) is a lie when the body offers nothing of it; reporting and museums keep their topical
# words. Violent words in a head are news more often than spam, so only these topics are judged:
HEAD_TOPICS = ("adult", "gambling")
# The title and description (not the keywords: a second language there is ordinary SEO) must be in the
# page's language or in English (the web's lingua franca: English titles over pages in other languages
# are common and true), whatever `languages` says. A field is foreign only when it has no part in the
# page's language:
#   - its own text, the words the body does not have, is at least HEAD_MIN_CHARS letters (a short title
#     is too little to identify) and HEAD_OWN_SHARE of the field's letters (a brand or a quotation the
#     body repeats, a quotation or a translation beside the page's own words, a description that says it
#     twice in two languages: none is a lie);
#   - it has none of the body's everyday words (an English description full of Japanese place names,
#     which lingua may take for Tagalog, still says "in" and "the");
#   - lingua, on the field, is sure of another language (HEAD_SURE) and gives the page's language and
#     English each under HEAD_DOUBT.
HEAD_MIN_CHARS = 24        # letters, a Chinese, Japanese or Korean character counted as three
HEAD_OWN_SHARE = 2 / 3
HEAD_SURE, HEAD_DOUBT = 0.5, 0.1


def head_topic_reason(fields: dict[str, str], body_topics: dict[str, tuple[int, int]], body: str) -> Optional[str]:
    """'title_adult', 'description_gambling', 'keywords_adult'... when a head field has an intent term
    of a topic whose intent terms the body lacks, and the body does not say that term either, at
    the start of a longer word ("porn" in an explainer's "pornographic content": the title names what
    the page is about; a hijacked bakery's body never says it)."""
    folded = None
    for field, text in fields.items():
        for topic in HEAD_TOPICS:
            if body_topics.get(topic, (0, 0))[0]:
                continue
            for term in {m.group(0).casefold() for m in INTENT[topic].finditer(text)}:
                folded = body.casefold() if folded is None else folded
                if not _says_word(folded, term):
                    return f"{field}_{topic}"
    return None


def _says_word(text: str, term: str) -> bool:
    """`term` in `text` where a word starts (anywhere in a dense script, which has no spaces)."""
    if language.DENSE_CHAR.search(term):
        return term in text
    return re.search(r"(?<!\w)" + re.escape(term), text) is not None


def head_language_reason(fields: dict[str, str], body: str, page_language: Optional[str],
                         wanted: Optional[frozenset]) -> Optional[str]:
    """'title_language: zh (page en)' when the title or description has no part in the page's language
    and is in another than English (HEAD_* above). `page_language` is detected here when not given."""
    words = None
    for field in ("title", "description"):
        text = fields.get(field, "")
        if head.weight(text) < HEAD_MIN_CHARS:
            continue
        words = head.body_words(body) if words is None else words
        own = head.own_text(text, body, words)
        if head.weight(own) < HEAD_MIN_CHARS or head.letters(own) < HEAD_OWN_SHARE * head.letters(text):
            continue
        if head.everyday_words(words) & {w.casefold() for w in head.words(text)}:
            continue
        page_language = page_language or language.detect(body, wanted or frozenset())
        if page_language is None:
            return None
        sure = language.confidences(text, wanted or frozenset())
        named = max(sure, key=sure.get, default=None)
        if named and sure[named] >= HEAD_SURE and max(sure.get(page_language, 0), sure.get("en", 0)) < HEAD_DOUBT:
            return f"{field}_language: {named} (page {page_language})"
    return None


# -- the verdict --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rules:
    """Curation settings (the `multiui` config keys). Defaults are the config's defaults; the detector
    and the blocklists are loaded lazily, once per worker process, so the object pickles small."""

    min_text_chars: int = 200
    min_hits: int = MIN_HITS
    languages: Optional[frozenset] = frozenset({"en"})   # None: any language
    blocklists: tuple = tuple(blocklist.DEFAULT.split(","))
    require_css: bool = False
    by_model: bool = True          # transforms/web/topic_model.py also judges topics, errors and placeholders

    @classmethod
    def from_settings(cls, min_text_chars: int = 200, languages: str = "en", blocklists: str = blocklist.DEFAULT,
                      require_css: bool = False, topic_model_name: str = topic_model.NAME) -> "Rules":
        """From the config's strings; raises ValueError saying what to set when one is wrong (and
        ImportError without lingua, which head_language_reason needs even with languages=any, or
        without the topic model's package when it is asked for)."""
        language.supported()
        use_model = topic_model.parse(topic_model_name)
        return cls(min_text_chars=min_text_chars, languages=language.wanted_languages(languages),
                   blocklists=blocklist.parse(blocklists), require_css=require_css, by_model=use_model)


CONTENT_ONLY = Rules(languages=None, blocklists=())


def _short_page_reason(url: str, title: str, heads: list[str], flat: str) -> Optional[str]:
    """What a short page (under SOFT_404_CHARS) may be besides content, by its words: an error page,
    a parked domain, a placeholder or a sign-in wall."""
    if says(ERROR_PHRASES, flat) and not discusses_errors(title, heads):
        return "error_page"
    if says(PARKED_SHORT, flat) or names_its_own_domain(url, flat, title, heads):
        return "parked"
    if says(PLACEHOLDER, flat) or any(PLACEHOLDER_HEADINGS.search(h) for h in [title, *heads]):
        return "error_page" if MAINTENANCE.search(flat) else "parked"
    if SIGN_IN_WALL.search(flat):
        return "too_little_text"
    return None


def _kind_reason(url: str, title: str, heads: list[str], flat: str, chars: int) -> Optional[str]:
    """An error or parked page however it is worded, in the model's languages: a short page at the
    kinds' own thresholds, a longer one (its site's menus, footers and offers around it) only where
    the head is sure of its opening text (up to KIND_PAGE_CHARS), its title and headings, its
    title or its first heading; parked, where it names its own host at its top (names_its_host: the
    head reads a registrar's or a host's product pages as parked), and a short page not where it lists
    prices (a host's plans); an error, on a short page that shows a price and another (a product's
    and its old one), only where the head is sure, as on a longer page. A longer page whose title or
    a heading names its own host, with a word for "domain" (names_its_own_domain), is judged parked
    as a short page is: a registrar's, broker's or host's page for that domain wrapped in their
    offers (a shop's or a registrar's own pages rarely name themselves so and are judged as any
    page). A page whose title and headings are about errors is not one (discusses_errors)."""
    title, heads = unquoted(title), [unquoted(h) for h in heads]
    outline = " . ".join([title, *heads]).strip(" .")
    if chars < SOFT_404_CHARS:
        kind = topic_model.judged(flat, topic_model.KINDS)
        by_head = topic_model.judged(flat, topic_model.KINDS, margins=False)
        if kind != by_head and language.detect(flat) in topic_model.OUTSIDE:   # lingua only where a margin decides
            kind = by_head
        offers = prices(flat)
        if kind == "parked" and offers >= PRICE_LIST:
            kind = None
        if kind == "error" and offers >= OFFER_PRICES and topic_model.sure_kind(flat) != "error":
            kind = None
    else:
        opening = flat if chars < KIND_PAGE_CHARS else ""
        kind = topic_model.sure_kind(opening, outline, title, heads[0] if heads else "")
        if kind == "parked" and not names_its_host(url, flat, title, heads):
            kind = None
        if kind is None and not asks(title) and names_its_own_domain(url, flat, title, heads) and any(
                topic_model.judged(t, ("parked",)) for t in (flat[:KIND_PAGE_CHARS], outline, title) if t):
            kind = "parked"
    if kind == "error" and discusses_errors(title, heads):
        return None
    return {"error": "error_page"}.get(kind, kind)


def rule_reason(page: dict, min_text_chars: int = 200, min_hits: int = MIN_HITS,
                rules: Optional[Rules] = None) -> Optional[str]:
    """Why the rules drop a page, or None. Without `rules`: the content rules only (no blocklist, any
    language), with the given thresholds.

    Reasons: 'rendered without its CSS (N stylesheets missing)', 'blocklist <list>: <what>',
    error_page (also a site down for maintenance), parked (also a site not there yet), too_little_text
    (under min_text_chars, or a sign-in wall: asked after error_page and parked), adult, gambling, violent
    (at least min_hits terms of the topic, one of them an intent term), title_adult, title_gambling,
    description_adult, description_gambling, keywords_adult, keywords_gambling (the head offers what the
    body does not), 'language: xx (not in en)' (of the visible text), 'title_language: xx (page en)',
    'description_language: xx (page en)'. Cheap rules run first; language identification, the costly
    one, last."""
    if rules is None:
        rules = Rules(min_text_chars=min_text_chars, min_hits=min_hits, languages=None, blocklists=())
    if rules.require_css:
        loaded, missing = page.get("stylesheets_loaded", 0) or 0, page.get("stylesheets_missing", 0) or 0
        if missing > 0 and loaded == 0:
            return f"rendered without its CSS ({missing} stylesheets missing)"
    url = page.get("final_url") or page.get("url") or ""
    listed = blocklist.blocklist_reason(url, rules.blocklists)
    if listed:
        return listed
    title, heads = page.get("title") or "", headings(page)     # headings read once: from HTML, a scan of it
    if ((ERROR_TITLES.search(title) or any(says(p, t) for p in (ERROR_PHRASES, GONE_PHRASES) for t in (title, *heads)))
            and (not is_article(page) or apologizes(title, heads)) and not discusses_errors(title, heads)):
        return "error_page"
    if maintenance_notice(title, heads):
        return "error_page"
    body = body_text(page)
    text = "\n".join([title, body]) if body else title      # page_text, without reading the body twice
    flat = _SPACE.sub(" ", text)        # a sentence split over several nodes ("The domain name / x.com / is for sale")
    if says(PARKED, flat) or is_link_farm(url, flat, title, heads):
        return "parked"
    chars = effective_chars(page, text)
    reason = _short_page_reason(url, title, heads, flat) if chars < SOFT_404_CHARS else None
    password = chars < max(SOFT_404_CHARS, rules.min_text_chars + SIGN_IN_FORM_CHARS) and has_password_field(page)
    a_form = chars < SOFT_404_CHARS and (password or form_fields(page) >= FORM_FIELDS)
    if not reason and rules.by_model and not a_form:
        reason = _kind_reason(url, title, heads, flat, chars)
    if reason:
        return reason
    if chars < rules.min_text_chars:
        return "too_little_text"
    if chars < rules.min_text_chars + SIGN_IN_FORM_CHARS and password:
        return "too_little_text"
    body_topics, other_topics = topic_hits(_SPACE.sub(" ", body)), topic_hits(title, url_text(url))
    counts = {topic: tuple(a + b for a, b in zip(body_topics.get(topic, (0, 0)), other_topics.get(topic, (0, 0))))
              for topic in PATTERNS}      # (intent terms, all terms) of each topic, in the page and its title and URL
    for topic, (intent, hits) in counts.items():
        if intent and hits >= rules.min_hits and not _words_only_report(topic, text, rules):
            return topic
    if rules.by_model:      # where the words found no business, the model may still see one
        reason = topic_model.judged(flat, topic_model.TOPICS) or _seconded(counts, flat, text, rules)
        if reason:
            return reason
    fields = head.fields(page)
    reason = head_topic_reason(fields, body_topics, body)
    if reason:
        return reason
    found = language.detect(body, rules.languages) if rules.languages is not None else None
    return (language.language_reason(found, rules.languages)
            or head_language_reason(fields, body, found, rules.languages))


def _seconded(counts: dict, flat: str, text: str, rules: Rules) -> Optional[str]:
    """A topic the model finds likely short of LIKELY (at topic_model.SECONDED) where the page also says
    one of the topic's words (`counts`: rule_reason's), not in a report about it: the words too few to
    decide, the model too unsure alone (an erotic-stories site's "racconti erotici" under its age gate)."""
    scores = topic_model.load().scores(flat)
    for topic, likely in topic_model.SECONDED.items():
        if scores[topic] >= likely and counts[topic][1] and not _words_only_report(topic, text, rules):
            return topic
    return None


def _words_only_report(topic: str, text: str, rules: Rules) -> bool:
    """The model reads the sentences holding the topic's words as reporting about it (topic_model.VETO)."""
    if not rules.by_model or topic not in topic_model.TOPICS:
        return False
    return topic_model.reports_on(topic, topic_model.sentences_with(text, PATTERNS[topic]))


JUDGE_SYSTEM = ("You review web pages for a training set. Answer with one word: KEEP if the page is a normal, "
                "working page; otherwise one of ADULT, GAMBLING, VIOLENT, DISCRIMINATORY, ERROR.")
JUDGE_LABELS = {"keep": None, "adult": "adult", "gambling": "gambling", "violent": "violent",
                "discriminatory": "discriminatory", "error": "error_page"}


def judge_request(page: dict, tree_text: str, sampling: Sampling) -> Request:
    """Ask the LLM judge about one page, from its accessibility tree as text."""
    messages = ({"role": "system", "content": JUDGE_SYSTEM},
                {"role": "user", "content": f"Title: {page.get('title', '')}\nURL: {page.get('final_url', '')}\n"
                                            f"Accessibility tree:\n{tree_text}\n\nVerdict:"})
    return Request(stable_id("multiui-judge", page["id"]), messages, sampling)


def judge_reason(completion: Completion) -> tuple[Optional[str], Optional[str]]:
    """(reason to drop or None, problem) from the judge's answer; problem is set when the answer is
    not one of the labels (the page is then kept: an unreadable verdict is no evidence against it)."""
    words = re.findall(r"[a-z]+", completion.text.lower())
    for word in words[:5]:
        if word in JUDGE_LABELS:
            return JUDGE_LABELS[word], None
    return None, f"judge answered {completion.text[:60]!r}, not a label"
