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
substrings (those scripts do not separate words, or glue particles to them). The measured
precision and recall on a labelled set of pages is printed by tests/test_web_curation.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

from transforms.llm.requests import Completion, Request, Sampling
from transforms.web import blocklist, language

# Characters of scripts that do not put spaces between words (or glue particles to them): terms in
# them are matched as substrings, and a character of them carries about a word's worth of text.
_DENSE = r"\u0e00-\u0e7f\u0600-\u06ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_DENSE_CHAR = re.compile(f"[{_DENSE}]")
_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def terms(words: Iterable[str]) -> re.Pattern:
    """One case-insensitive pattern: whole words for spaced scripts, substrings for dense ones.
    A term may be a regular expression (its letters are not escaped)."""
    parts = []
    for word in words:
        if _DENSE_CHAR.search(word):
            parts.append(f"(?:{word})")
        else:
            parts.append(rf"(?<!\w)(?:{word})(?!\w)")
    return re.compile("|".join(parts), re.I)


# -- error pages ------------------------------------------------------------------------------------
# A title that *starts* with one of these is an error page (generic words: only at the start).
ERROR_TITLES = re.compile(
    r"^\s*(\d{3}\b|error\b|not found|page not found|access denied|forbidden|service unavailable|"
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
    "접근이 거부", "오류가 발생했습니다",
    # ar
    "الصفحة غير موجودة", "لم يتم العثور على الصفحة", "خطأ 404", "الصفحة المطلوبة غير موجودة",
    # th
    "ไม่พบหน้า",
])
# A page whose text is shorter than this (effective characters) and carries an error phrase anywhere
# is an error page; longer pages only when the phrase is in the title or a heading.
SOFT_404_CHARS = 800

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
    "도메인 판매", "이 도메인은 판매", "هذا النطاق للبيع",
])

# -- topics -----------------------------------------------------------------------------------------
# Deliberately specific terms: they flag pages whose text is about the topic, not pages that mention
# a word once (a news article on gambling regulation passes with one hit; a casino does not). Words
# that are also ordinary (Spanish "sexo" is a form's gender field, Korean 성인 is "adult education")
# appear only inside longer phrases.
KEYWORDS = {
    "adult": (
        # en
        "porn", "porno", "xxx", "nsfw", "camgirl", "camgirls", "escort", "escorts", "hentai", "nude",
        "nudes", "sex cam", "adult videos", "sex videos?", "free porn", "milf", "pornstars?",
        # es, pt, it, fr, de
        r"v[ií]deos? (porno|de sexo|x)", "putas", "follando", "chicas desnudas", "sexo gratis", "pornô",
        "putaria", "acompanhantes", "mulheres nuas", "video di sesso", "sesso gratis", "troie", "film porno",
        r"vidéos? (porno|de sexe|x)", "sexe gratuit", "salopes?", "plan cul", "rencontres? sexe", "pornos",
        "sexfilme?", "sexkontakte", "nackte?", "huren", "titten", "erotikfilme?",
        # ru
        "порно", "порнуха", "секс видео", "эротика", "проститутки", "шлюхи", "индивидуалки", "интим услуги",
        # zh
        "色情", "成人视频", "成人影片", "成人影院", "成人网站", "黄色网站", "黄色视频", "黄片", "无码", "有码", "激情视频",
        "自拍偷拍", "偷拍", "三级片", "做爱", "性爱", "裸聊", "约炮", "情色", "乱伦", "亚洲色图", "av女优", "av在线",
        "日韩av", "成人電影", "色情網站", "無碼", "成人影片", "做愛", "性愛", "情色網", "一本道",
        # ja
        "アダルト動画", "エロ動画", "無修正", "av女優", "セックス", "出会い系", "エロ画像", "アダルトサイト",
        # ko
        "야동", "무료야동", "성인영상", "성인사이트", "성인방송", "섹스", "포르노", "조건만남", "출장안마",
    ),
    "gambling": (
        # en
        "casino", "casinos", r"(play|online|free|video|mega|real money) slots", "slots online", "slot games?",
        "slot machines?", "jackpot", "sportsbook", "betting odds", "roulette",
        "poker room", "free spins", "place your bets", "bookmakers?", "online betting", "deposit bonus",
        "no deposit bonus", "baccarat", "blackjack",
        # es, pt, it, fr, de
        "apuestas", "apuestas deportivas", "casa de apuestas", "tragamonedas", "tragaperras", "ruleta",
        "giros gratis", "bono de bienvenida", "cassino", "apostas", "apostas esportivas", "caça-níqueis",
        "rodadas grátis", "roleta", "casinò", "scommesse", "giri gratis", "bonus senza deposito",
        "machines à sous", "paris sportifs", "jeux d.argent", "tours gratuits", "bonus sans dépôt",
        "spielautomaten", "sportwetten", "freispiele", "spielothek", "buchmacher", "online-casino",
        # ru
        "казино", "игровые автоматы", "ставки на спорт", "букмекер", "букмекерская", "букмекерские", "рулетка",
        "фриспины", "джекпот", "игровые слоты",
        # zh
        "赌场", "赌博", "博彩", "六合彩", "百家乐", "老虎机", "时时彩", "北京赛车", "重庆时时彩", "彩票投注", "购彩", "投注",
        "下注", "娱乐城", "真人娱乐", "体育投注", "彩金", "开奖", "棋牌", "电子游艺", "幸运飞艇", "快三", "竞彩",
        "賭場", "賭博", "百家樂", "老虎機", "娛樂城", "投注", "網上賭", "六合彩",
        # ja
        "オンラインカジノ", "カジノ", "パチスロ", "ブックメーカー", "入金不要ボーナス", "バカラ",
        "フリースピン", "ルーレット", "スロットマシン",
        # ko
        "카지노", "바카라", "토토사이트", "스포츠토토", "사설토토", "먹튀", "배팅", "베팅", "슬롯머신", "룰렛", "온라인카지노",
    ),
    "violent": (
        "gore", "beheading", "execution video", "snuff", "mass shooting video", "torture video", "kill yourself",
        "斩首视频", "血腥视频", "砍头", "グロ画像", "処刑動画", "참수 영상", "расчлененка", "видео казни",
    ),
}
MIN_HITS = 3
PATTERNS = {topic: terms(words) for topic, words in KEYWORDS.items()}


# -- the page's text ----------------------------------------------------------------------------------
_TAGS = re.compile(r"<(script|style|noscript|template)\b.*?</\1\s*>|<!--.*?-->|<[^>]+>", re.S | re.I)
_SPACE = re.compile(r"\s+")


def page_text(page: dict) -> str:
    """The title and the visible text of the tree: what a reader of the screenshot sees. The tree's
    StaticText nodes are its text (a heading's name repeats its StaticText child, so when the tree has
    StaticText only those count); without a tree, the HTML's text."""
    nodes = page.get("nodes") or ()
    static = [n["name"] for n in nodes if n.get("role") == "StaticText" and n.get("name")]
    names = static or [n["name"] for n in nodes if n.get("name")]
    if not names and page.get("html"):
        names = [html_text(page["html"])]
    return "\n".join([page.get("title") or ""] + names)


def html_text(html: str, limit: int = 200_000) -> str:
    """The text of an HTML document, roughly (tags, scripts and styles removed): the fallback when a
    row has no tree."""
    from html import unescape
    return _SPACE.sub(" ", unescape(_TAGS.sub(" ", html[:limit]))).strip()


def headings(page: dict) -> list[str]:
    return [n["name"] for n in page.get("nodes") or () if n.get("role") == "heading" and n.get("name")]


def effective_chars(page: dict, text: str) -> int:
    """Visible characters, with a Chinese, Japanese or Korean character counted as three: a word's worth
    (so min_text_chars means about as much text in every script)."""
    chars = page.get("text_chars")
    if chars is None:
        chars = len(text) - len(page.get("title") or "")
    return chars + 2 * len(_CJK_CHAR.findall(text))


def url_text(url: str) -> str:
    """A URL's words (host and path split on punctuation), for keyword rules."""
    return re.sub(r"[\W_]+", " ", re.sub(r"^[a-z]+://", "", url or "", flags=re.I))


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

    @classmethod
    def from_settings(cls, min_text_chars: int = 200, languages: str = "en", blocklists: str = blocklist.DEFAULT,
                      require_css: bool = False) -> "Rules":
        """From the config's strings; raises ValueError saying what to set when one is wrong."""
        return cls(min_text_chars=min_text_chars, languages=language.wanted_languages(languages),
                   blocklists=blocklist.parse(blocklists), require_css=require_css)


CONTENT_ONLY = Rules(languages=None, blocklists=())


def rule_reason(page: dict, min_text_chars: int = 200, min_hits: int = MIN_HITS,
                rules: Optional[Rules] = None) -> Optional[str]:
    """Why the rules drop a page, or None. Without `rules`: the content rules only (no blocklist, no
    language identification), with the given thresholds.

    Reasons: 'rendered without its CSS (N stylesheets missing)', 'blocklist <list>: <what>',
    error_page, parked, too_little_text, adult, gambling, violent, 'language: xx (not in en)'.
    Cheap rules run first; language identification, the costly one, last."""
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
    title = page.get("title") or ""
    if ERROR_TITLES.search(title) or ERROR_PHRASES.search(title) or any(ERROR_PHRASES.search(h) for h in headings(page)):
        return "error_page"
    text = page_text(page)
    if PARKED.search(text):
        return "parked"
    chars = effective_chars(page, text)
    if chars < rules.min_text_chars:
        return "too_little_text"
    if chars < SOFT_404_CHARS and ERROR_PHRASES.search(text):
        return "error_page"
    scanned = text + "\n" + url_text(url)
    for topic, pattern in PATTERNS.items():
        if len(pattern.findall(scanned)) >= rules.min_hits:
            return topic
    return language.language_reason(text, rules.languages)


JUDGE_SYSTEM = ("You review web pages for a training set. Answer with one word: KEEP if the page is a normal, "
                "working page; otherwise one of ADULT, GAMBLING, VIOLENT, DISCRIMINATORY, ERROR.")
JUDGE_LABELS = {"keep": None, "adult": "adult", "gambling": "gambling", "violent": "violent",
                "discriminatory": "discriminatory", "error": "error_page"}


def judge_request(page: dict, tree_text: str, sampling: Sampling) -> Request:
    """Ask the LLM judge about one page, from its accessibility tree as text."""
    from transforms.io.ids import stable_id
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
