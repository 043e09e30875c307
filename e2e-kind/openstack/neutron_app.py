"""Neutron's API as a WSGI application for gunicorn.

Neutron boots from sys.argv when its WSGI module is imported; gunicorn's own arguments must not
reach it, so this module replaces them with the config files named in CLOUDNET_NEUTRON_CONFIG
(separated by ';') before importing it.
"""
import os
import sys

sys.argv = ["neutron-api"]
for path in os.environ["CLOUDNET_NEUTRON_CONFIG"].split(";"):
    sys.argv += ["--config-file", path]

from neutron.wsgi.api import application  # noqa: E402,F401
