"""`shardsmith view`: a local browser for a published dataset (a folder or an s3:// / gs:// prefix).

`tables.py` reads a table page by page from Parquet row groups (never the whole table);
`app.py` is the Flask app: the run's overview, paged rows with filters, one row in full; `look.py`
is what a dataset adds to them (its overview section, its row extras, its own pages, its pictures),
filled in by each dataset's module here (`multiui.py`, `selfmoe.py`, ...); `pictures.py` draws as
PNG, and `gallery.py` lists every picture a dataset's look has, for the app's routes and for
`shardsmith inspect --pictures`. Every value shown comes from crawled pages, model output or Lean
code, so the app renders nothing as HTML: Jinja escapes every value, no page runs a script, and a
strict Content-Security-Policy says so to the browser as well.
"""
