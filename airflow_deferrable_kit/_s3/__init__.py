"""aiobotocore behind the S3 waits: the client and the shared listings and HEADs.

One job per module; each imports only the modules listed above it:

* ``client``: an Airflow ``aws`` connection -> frozen :class:`S3Options` (``load_options``), a new
  client built off the loop (``new_client``), botocore's errors -> ours (``s3_request``,
  ``classify_s3_error``), every private-API use fenced.
* ``signed``: HEAD and ListObjectsV2 requests signed and sent directly (botocore's answers, less CPU).
* ``key_groups``: when one listing of a folder or prefix answers many exact-key polls.
* ``poller``: ``S3Poller``, the shared client, one per connection per process (``open_poller`` /
  ``close_poller``): shared listings within one reuse window (``listing_reuse_window``) and
  bucket checks.
"""
