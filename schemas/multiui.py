"""multiui: rendered web pages and the nine MultiUI task types (ICLR 2025; docs/papers/multiui.md).

Two tables. `pages` holds each rendered page once per platform: the screenshot,
the HTML and the enhanced accessibility tree (every visible node with its box).
`samples` holds LLaVA-style conversations that refer to a page's screenshot by
`page_id`, so an image is stored once however many samples ask about it. Element OCR
asks about a target framed in red: the sample stores the frame (`box_px`), not a copy of
the page with the frame drawn on it (samples v1 did: 247 page copies, 44 MB, against
5.1 MB for the 32 pages of one run), and whoever reads it draws the frame at load time
with core/marks.py (the trainer, `shardsmith export`), so the pixels are the same everywhere.
"""
import pyarrow as pa

from schemas.table import Field, TableSchema

DATASET = "multiui"

TASKS = ("webpage_caption", "embedded_image_caption", "webpage_qa", "embedded_image_qa",
         "action_prediction", "action_grounding", "element_grounding", "heading_ocr", "element_ocr")
PLATFORMS = ("desktop", "mobile")

BOX = pa.list_(pa.float32(), 4)

NODE = pa.struct([
    pa.field("node_id", pa.int32(), nullable=False),
    pa.field("parent", pa.int32(), nullable=False),
    pa.field("depth", pa.int16(), nullable=False),
    pa.field("role", pa.string(), nullable=False),
    pa.field("name", pa.string(), nullable=False),
    pa.field("tag", pa.string(), nullable=False),
    pa.field("box", BOX, nullable=False),
    pa.field("box_norm", BOX, nullable=False),
    pa.field("interactive", pa.bool_(), nullable=False),
    pa.field("href", pa.string()),
    pa.field("src", pa.string()),
    pa.field("alt", pa.string()),
])

ACTION = pa.struct([
    pa.field("node_id", pa.int32(), nullable=False),
    pa.field("target_url", pa.string(), nullable=False),
    pa.field("target_title", pa.string(), nullable=False),
])

TURN = pa.struct([pa.field("from", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=False)])

PAGES = TableSchema(
    dataset=DATASET,
    table="pages",
    version=3,  # 3: glyphs_missing; sub-resources counted up to the settle point (transforms/web/subresources.py)
                # 2: stylesheets/images loaded and missing; nodes judged visible by clipping, opacity, cover
    doc="One rendered page per (source, platform): screenshot, HTML, enhanced accessibility tree, curation.",
    split_field="platform",
    fields=(
        Field("id", pa.string(), "Stable hash of the source reference, platform and render settings."),
        Field("url", pa.string(), "URL asked for (for WARC and local pages, the URL the page was served under)."),
        Field("final_url", pa.string(), "URL after redirects."),
        Field("source", pa.string(), "url: fetched live; warc: replayed from an archive; local: an HTML folder."),
        Field("source_ref", pa.string(), "Where the page came from: the URL, WARC file#record offset, or file path."),
        Field("platform", pa.string(), "desktop (Windows 10 Chrome, H/W 0.5-1.5) or mobile (iPhone 12 Pro, H/W 1.5-2.5)."),
        Field("viewport_width", pa.int32(), "Viewport width in CSS pixels."),
        Field("viewport_height", pa.int32(), "Viewport height in CSS pixels (seeded aspect ratio)."),
        Field("device_scale_factor", pa.float32(), "Device pixels per CSS pixel (3 on the iPhone 12 Pro)."),
        Field("title", pa.string(), "document.title after load."),
        Field("html", pa.string(), "Serialized DOM after load (page.content())."),
        Field("screenshot", pa.binary(),
              "PNG of the page from the top, full width, height capped; null for pages curation dropped.",
              nullable=True),
        Field("screenshot_width", pa.int32(), "Screenshot width in pixels (0 when no screenshot)."),
        Field("screenshot_height", pa.int32(), "Screenshot height in pixels (0 when no screenshot)."),
        Field("nodes", pa.list_(NODE),
              "Enhanced accessibility tree: visible nodes of Accessibility.getFullAXTree joined with "
              "DOMSnapshot boxes; box = [l, t, r, b] in screenshot pixels, box_norm the same in [0, 1]; "
              "parent = -1 for the root; interactive = focusable or a link, button or form control."),
        Field("actions", pa.list_(ACTION),
              "Links the renderer followed: the node clicked and the title of the page it leads to "
              "(source of action prediction)."),
        Field("text_chars", pa.int64(), "Characters of visible text in the tree (names of text nodes)."),
        Field("glyphs_missing", pa.string(),
              "The characters of the visible text that no installed font has a glyph for (the screenshot "
              "shows an empty box), distinct, in code point order; '' when every one shows. Whitespace, "
              "control and format characters never count. No sample asks about text holding one."),
        Field("stylesheets_loaded", pa.int32(),
              "Stylesheets the page loaded (from the archive or the network), of those it asked for until two "
              "animation frames after load; each counted once, by its outcome after redirects."),
        Field("stylesheets_missing", pa.int32(),
              "Stylesheets the page asked for and did not get (not archived, refused, failed, 4xx/5xx, or no "
              "answer within the timeout)."),
        Field("images_loaded", pa.int32(), "Images the page loaded (counted as stylesheets are)."),
        Field("images_missing", pa.int32(), "Images the page asked for and did not get."),
        Field("kept", pa.bool_(), "Whether curation kept the page (only kept pages yield samples)."),
        Field("reject_reason", pa.string(),
              "Why curation dropped it: error_page, parked, too_little_text, adult, gambling, violent, "
              "title_adult, title_gambling, description_adult, description_gambling, keywords_adult, "
              "keywords_gambling (the head offers what the visible text does not), 'blocklist LIST: ...', "
              "'language: xx (not in ...)', 'title_language: xx (page yy)', 'description_language: xx (page yy)', "
              "'rendered without its CSS ...', llm_judge; null when kept.", nullable=True),
    ),
)

SAMPLES = TableSchema(
    dataset=DATASET,
    table="samples",
    version=2,
    doc="LLaVA-style instruction samples of the nine MultiUI tasks, referring to page screenshots.",
    split_field="task",
    fields=(
        Field("id", pa.string(), "Stable hash of page id, task, target and template."),
        Field("page_id", pa.string(), "The `pages` row whose screenshot the sample is about."),
        Field("task", pa.string(), "One of: " + ", ".join(TASKS) + "."),
        Field("platform", pa.string(), "desktop or mobile (the page's)."),
        Field("template_id", pa.int32(), "Index of the instruction template used for the task."),
        Field("generator", pa.string(), "rule, or llm:<model id> for LLM-written questions and answers."),
        Field("conversations", pa.list_(TURN),
              "LLaVA turns ({from: human|gpt, value}); the first human turn starts with '<image>\\n'."),
        Field("target_node", pa.int32(), "node_id of the element the sample is about; null for page-level tasks.",
              nullable=True),
        # a variable-size list: pyarrow 25 cannot read back a nullable fixed-size list holding nulls
        Field("bbox", pa.list_(pa.float32()), "Target box [l, t, r, b] (4 values) normalised to [0, 1], 3 decimals; "
              "null when none.", nullable=True),
        Field("box_px", pa.list_(pa.int32()),
              "Target box [l, t, r, b] (4 values) in the page screenshot's pixels, rounded; set by the rule tasks, "
              "null for page-level and LLM-written samples. "
              "For the tasks in MARKED_TASKS (element OCR) the sample's image is the page screenshot with "
              # the text is part of the schema's fingerprint, so it stays as v2 wrote it: the frame
              # is now drawn by core/marks.py (mark_rect, MARK_WIDTH, MARK_COLOR)
              "this box framed in red, drawn by the reader (schemas.multiui.mark_rect: a MARK_WIDTH px "
              "MARK_COLOR frame just outside the box). v2; v1 stored that image as a PNG in `image`.",
              nullable=True),
    ),
)

TABLES = (PAGES, SAMPLES)

# The tasks whose sample image is the page screenshot with the target framed in red (core/marks.py draws
# the frame; every reader of `samples` calls it, so the pixels agree).
MARKED_TASKS = ("element_ocr",)
