"""A user module that raises while it is imported (a reference into it must say so)."""

raise RuntimeError("the app's settings are missing")
