"""The client contract, complete, for a service anyone has: a directory of files.

docs/development.md ("The client contract") points here. A client package is the one place a
wait's library lives; this one wraps the standard library's file calls the way ``_s3/`` wraps
aiobotocore:

* ``client``: the door: ``load_options`` (connection -> frozen options), ``open_reader`` /
  ``close_reader`` (the shared client, keyed by its options), ``classify_files_error`` (the
  library's errors -> ours, once).
"""
