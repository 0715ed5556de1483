"""multiui: rendered web pages and the nine MultiUI task types (docs/papers/multiui.md)."""
from __future__ import annotations

import os

from core.config import ConfigError, ConfigSpec, Key, Resolved, matching_files, names, settings_from, stored
from pipelines.dataset import Dataset, input_fingerprint, responses
from pipelines.llm_keys import check_llm, llm_keys, make_backend
from schemas import multiui as schema
from core import storage
from core.dataset_folder import table_locations
from transforms.io.shards import TableSpec
from transforms.web.chromium import CHROMIUM, INSTALL_HINT
from transforms.llm.models import resolve_model
from transforms.llm.openai_backend import OpenAIBackend
from transforms.llm.requests import Sampling
from transforms.web.capture import CaptureSettings
from transforms.web.render import JS_HEAP_MB, PROCESS_MB
from transforms.web.curation import Rules
from transforms.web.multiui_graph import MultiuiGraph, MultiuiSettings
from transforms.web.tasks import TaskRules
from transforms.web.tls_authority import check_roots

SAMPLE_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sites", "multiui")


def warc_files(c: dict) -> list[str]:
    return matching_files(c["warc"], "warc")


def sources(c: dict) -> list[tuple[str, str]]:
    """(kind, location) of every input (an absolute path or a store URL); the sample site when none is given."""
    out = [("urls", storage.normalize(c["urls"]))] if c["urls"] else []
    out += [("warc", f) for f in warc_files(c)]
    if c["html_dir"]:
        out.append(("local", storage.normalize(c["html_dir"])))
    return out or [("local", SAMPLE_SITE)]


def llm_page_count(value: str) -> int | None:
    """The llm_pages key as a count of pages, None for every page (`all` or 0)."""
    text = str(value).strip().lower()
    if text in ("all", "0"):
        return None
    if not text.isdigit():
        raise ConfigError(f"llm_pages: a number of pages (e.g. 2) or all for every page, got {value!r}")
    return int(text)


def _check(c: dict) -> None:
    bad = [p for p in names(c["platforms"]) if p not in schema.PLATFORMS]
    if bad or not names(c["platforms"]):
        raise ConfigError(f"platforms: name desktop, mobile or both (got {c['platforms']!r})")
    bad = [t for t in names(c["tasks"]) if t not in schema.TASKS]
    if bad or not names(c["tasks"]):
        raise ConfigError(f"tasks: unknown {bad or c['tasks']!r}; choose from {', '.join(schema.TASKS)}")
    if c["html_dir"] and not stored(c["html_dir"], "html_dir", storage.is_dir):
        raise ConfigError(f"html_dir {c['html_dir']!r} is not a folder (or a store prefix with files under it)")
    warc_files(c)
    if c["backend"] == "openai" and not c["base_url"] and (c["llm_tasks"] or c["llm_judge"]):
        check_llm(c)
    llm_page_count(c["llm_pages"])
    curation_rules(c)
    if c["vision_base_url"] and not c["vision_model"]:
        raise ConfigError("vision_base_url needs vision_model (the model name the server serves)")
    if not os.path.exists(c["chromium"]):
        raise ConfigError(f"no Chromium at {c['chromium']}: {INSTALL_HINT}")


CONFIG = ConfigSpec(check=_check, keys=(
    Key("urls", str, None, "a file of URLs to render, one per line (# comments); a path or an s3:// / gs:// URL",
        optional=True, is_path=True, gridable=False),
    Key("warc", str, None, "WARC / WARC.gz files (comma-separated paths, globs or s3:// / gs:// URLs), replayed "
        "with no live network", optional=True, gridable=False),
    Key("html_dir", str, None, "a folder (or s3:// / gs:// prefix) of HTML pages, served from a loopback server "
        "on each worker (default when no input is given: the bundled sample site)", optional=True, gridable=False),
    Key("platforms", str, "desktop,mobile", "desktop (Windows 10, H/W 0.5-1.5) and/or mobile (iPhone 12 Pro)"),
    Key("shared_load", bool, True, "desktop and mobile from one load of a page (mobile is the loaded page "
        "switched to the phone's user agent, touch and viewport; a live page that varies by user agent is loaded "
        "again); false: each platform loads the page itself (scripts that read the user agent at load see the phone's)"),
    Key("seed", int, 0, "seed of viewports, link choice, templates and distractors", low=0),
    Key("timeout_s", float, 15.0, "per-page time budget: loading, settling and capture together (and each "
        "followed link its own)", low=0.5),
    Key("max_page_mb", float, 16.0, "per-page size budget: bytes the page may load", low=0.01),
    Key("max_screenshot_height", int, 4096, "screenshot height cap in pixels", low=64),
    Key("follow_links", int, 3, "links clicked per page for action prediction", low=0),
    Key("allow_private", bool, False, "let live URLs reach private (RFC 1918) addresses; loopback, link-local "
        "and multicast stay refused"),
    Key("allow_loopback", bool, False, "let live URLs reach loopback addresses (tests and local servers only)"),
    Key("subresources", str, "archive", "where a replayed (WARC) page gets the CSS, fonts and images its archive "
        "lacks: archive (nowhere: refused) or live (fetched under the fetch policy)", choices=("archive", "live")),
    Key("max_image_mpx", float, 40.0, "an image whose header says it has more megapixels than this is refused "
        "before the browser decodes it (a 12 KB PNG can say 10000 x 10000: 400 MB decoded)", low=0.01),
    Key("js_heap_mb", int, JS_HEAP_MB, "a page's JavaScript heap in MB; a page that needs more fails (its "
        "renderer dies) and the next renders", low=16),
    Key("browser_process_mb", int, PROCESS_MB, "private memory each browser process may hold (its renderers "
        "included): a page's drawing past it fails in the page, not in the machine", low=256),
    Key("tls_roots", str, None, "a PEM file (or store location) of CA certificates the fetch proxy trusts besides "
        "the system's when it verifies https servers (a private PKI); verification cannot be turned off",
        optional=True),
    Key("chromium", str, CHROMIUM, "the Chromium binary Playwright drives (a full /usr/bin/chromium works too, at about twice the CPU a page)"),
    Key("min_text_chars", int, 200, "curation: pages with less visible text are dropped", low=0),
    Key("llm_judge", bool, False, "curation: also ask the LLM whether to keep each page"),
    Key("languages", str, "en", "curation: keep pages whose text is in these languages (comma-separated ISO 639-1 "
        "codes, detected by lingua) or any"),
    Key("blocklist", str, "ut1,url_words", "curation: drop pages whose URL is listed: ut1 (UT1 blacklist domains), "
        "url_words (FineWeb's banned URL words), both from the datatrove wheel; a file of domains/URLs; or none"),
    Key("require_css", bool, False, "curation: drop pages rendered with all their stylesheets missing"),
    Key("topic_model", str, "use-multilingual", "curation: also judge adult and gambling pages with a multilingual "
        "sentence encoder (16 languages; transforms/web/topic_model.py), or none: by word lists alone",
        choices=("use-multilingual", "none")),
    Key("tasks", str, ",".join(schema.TASKS), "comma-separated tasks to make"),
    Key("max_per_task", int, 8, "samples (or LLM requests) per page and task", low=0),
    Key("llm_tasks", bool, True, "make the LLM-written tasks (caption, QA, action grounding)"),
    Key("llm_pages", str, "2", "kept pages that get the LLM tasks, a seeded draw: a number >= 1, or all (also 0) "
        "for every page; the default model on CPU takes about a minute a page", gridable=False),
    Key("caption_tokens", int, 160, "max tokens of a webpage caption (3 to 5 sentences fit in about 120)", low=1),
    Key("qa_tokens", int, 256, "max tokens of a webpage QA completion (4 pairs fit in about 200)", low=1),
    Key("instruction_tokens", int, 48, "max tokens of an action-grounding instruction", low=1),
    Key("vision_base_url", str, None, "OpenAI-compatible server of a vision model for the embedded image tasks "
        "(without it they are skipped and counted)", optional=True),
    Key("vision_model", str, None, "the vision model's served name", optional=True),
    *llm_keys(temperature=0.7, batch_size=8),
))


def curation_rules(c: dict):
    """The curation settings of a config; ConfigError saying what to set when one is wrong."""
    try:
        return Rules.from_settings(c["min_text_chars"], c["languages"], c["blocklist"], c["require_css"],
                                   c["topic_model"])
    except (ValueError, ImportError) as exc:
        raise ConfigError(str(exc)) from None


def tables(resolved: Resolved) -> dict[str, TableSpec]:
    # pages hold screenshots and HTML (about 1 MB each): a few hundred per shard
    return {"pages": TableSpec(schema.PAGES, row_group_rows=16),
            "samples": TableSpec(schema.SAMPLES, row_group_rows=1024)}


def settings(resolved: Resolved):
    """The graph's settings (transforms/web/multiui_graph.py) from the resolved config."""
    if len(resolved.grid) != 1:
        raise ConfigError(f"multiui runs one configuration at a time; these keys got lists: {resolved.swept}")
    c = resolved.grid[0]
    srcs = sources(c)
    html = [path for kind, path in srcs if kind == "local"]
    if len(html) > 1:
        raise ConfigError("one html_dir per run")

    def sampling(max_tokens):
        return settings_from(Sampling, c, max_tokens=max_tokens)

    vision = None
    if c["vision_base_url"]:
        vision = OpenAIBackend(c["vision_base_url"], c["vision_model"], batch_size=c["batch_size"],
                               max_retries=c["retries"])
    return settings_from(
        MultiuiSettings, c, sources=tuple(srcs), platforms=tuple(names(c["platforms"])),
        capture=settings_from(CaptureSettings, c, timeout_ms=int(c["timeout_s"] * 1000),
                              max_page_bytes=int(c["max_page_mb"] * 2**20), tls_roots=tls_roots(c)),
        tasks=tuple(names(c["tasks"])), rules=settings_from(TaskRules, c),
        sampling={"webpage_caption": sampling(c["caption_tokens"]), "webpage_qa": sampling(c["qa_tokens"]),
                  "action_grounding": sampling(c["instruction_tokens"]), "embedded_image": sampling(300)},
        curation=curation_rules(c), llm_pages=llm_page_count(c["llm_pages"]),
        judge=Sampling(temperature=0.0, max_tokens=4) if c["llm_judge"] else None,
        backend=make_backend(c) if c["llm_tasks"] or c["llm_judge"] else None, vision_backend=vision,
        cache_location=responses(c), html_folder=html[0] if html else None)


def tls_roots(c: dict) -> str | None:
    """The tls_roots key's PEM text, read here so that it travels to the workers; a one-line error
    for a file that is missing or holds no CA certificate."""
    if not c["tls_roots"]:
        return None
    raw = stored(c["tls_roots"], "tls_roots", storage.read_bytes)
    try:
        return check_roots(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"key 'tls_roots': {c['tls_roots']}: {e}") from None


def build(pipeline, resolved: Resolved, ledger):
    return pipeline | "MultiUI" >> MultiuiGraph(settings(resolved), ledger)


def inputs(resolved: Resolved) -> dict[str, str]:
    return {f"{kind}/{storage.basename(path)}": input_fingerprint(path) for kind, path in sources(resolved.values)}


def picture(path: str, png: str | None = None, *, sample_id: str | None = None, task: str | None = None) -> str:
    """Write one sample as a PNG: its image with the target box, the question and answer beneath."""
    import pyarrow.dataset as ds
    from transforms.web.tasks.draw import render_sample_card
    fs, _ = storage.filesystem(path)

    def table(name):  # only the files the manifest lists (a store URL works too)
        return ds.dataset([storage.filesystem(f)[1] for f in table_locations(path, name)], filesystem=fs,
                          format="parquet")

    samples = table("samples")
    if sample_id:
        chosen = samples.to_table(filter=ds.field("id") == sample_id).to_pylist()
    else:
        wanted = ds.field("task") == task if task else None
        rows = samples.to_table(filter=wanted, columns=["id", "bbox"]).to_pylist()
        rows.sort(key=lambda r: (r["bbox"] is None, r["id"]))   # a sample with a box shows the most
        chosen = samples.to_table(filter=ds.field("id") == rows[0]["id"]).to_pylist() if rows else []
    if not chosen:
        raise ConfigError(f"no sample {'with id ' + sample_id if sample_id else 'of task ' + str(task)} in {path}")
    sample = chosen[0]
    pages = table("pages")     # samples v2: element OCR's frame is its bbox, drawn here like any box
    found = pages.to_table(filter=ds.field("id") == sample["page_id"], columns=["screenshot"]).to_pylist()
    if not found or found[0]["screenshot"] is None:
        raise ConfigError(f"sample {sample['id']}: its page {sample['page_id']} has no screenshot in {path}")
    image = found[0]["screenshot"]
    turns = sample["conversations"]
    card = render_sample_card(image, sample["bbox"],
                              f"[{sample['task']}] " + turns[0]["value"].removeprefix("<image>\n"), turns[1]["value"] if len(turns) > 1 else "")
    png = png or f"multiui-{sample['id']}.png"
    with open(png, "wb") as fh:
        fh.write(card)
    return os.path.abspath(png)


def train_setup(config: dict, manifest: dict) -> dict:
    """model=tiny builds its tokenizer from the default LLM's (trainers cannot resolve models)."""
    if config.get("model", "tiny") != "tiny" or config.get("tokenizer"):
        return config
    try:
        return dict(config, tokenizer=str(resolve_model("smollm2-135m-instruct").path))
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise ConfigError(f"model=tiny needs a tokenizer: {exc}; pass --set tokenizer=PATH") from None


class MultiUI(Dataset):
    name = schema.DATASET
    summary = "MultiUI: web pages rendered in Chromium (screenshot, accessibility tree) and nine task types"
    config = CONFIG
    schemas = schema.TABLES
    trainer = "trainers.multiui:train"
    filter_stages = ("llm_parse", "vision_parse")
    tables = staticmethod(tables)
    build = staticmethod(build)
    inputs = staticmethod(inputs)
    train_setup = staticmethod(train_setup)
    picture = staticmethod(picture)


DATASET = MultiUI()
