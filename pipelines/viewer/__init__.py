"""`shardsmith view`: a local browser for a published dataset (a folder or an s3:// / gs:// prefix).

`tables.py` reads a table page by page from Parquet row groups (never the whole table);
`app.py` is the Flask app: the run's overview, paged rows with filters, one row in full, and each
dataset's own views; `views.py` reads what those views show from the tables, `pictures.py` draws
it as PNG, and `gallery.py` names every picture a dataset has, for the app's routes and for
`shardsmith inspect --pictures`. Every value shown comes from crawled pages, model output or Lean
code, so the app renders nothing as HTML: Jinja escapes every value, no page runs a script, and a
strict Content-Security-Policy says so to the browser as well.
"""
