"""Keystone's API as a WSGI application for gunicorn.

Keystone parses sys.argv with oslo.config when it boots; gunicorn's own arguments must not reach
it, so this module hides them (the config comes from OS_KEYSTONE_CONFIG_DIR/_FILES).
"""
import sys

sys.argv = ["keystone"]

from keystone.wsgi.api import application  # noqa: E402,F401
