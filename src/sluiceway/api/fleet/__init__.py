"""Routes for routers and fleets: load, server info, prefix-cache reset, KV event
sources and prompt rendering."""
