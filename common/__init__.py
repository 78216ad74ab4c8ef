"""The control plane's ground floor: code every app needs and that needs no app.

The OpenAI/DRF error type (`errors`), the ORM called from async code (`asyncdb`) and the turn its
writes take (`write_priority`), the client's address behind trusted proxies (`client_ip`), DRF's
CSV/JSON-lines renderers and cursor pages (`renderers`, `pagination`) and the admin's SVG charts
(`admin_charts`). Nothing here imports a project package:
tenants/, billing/ and controlplane/'s apps all stand on it (tests/test_import_layers.py).
"""
