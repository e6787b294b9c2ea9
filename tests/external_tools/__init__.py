"""Checks that run a program outside Python, which `bash deploy/dev.sh test` installs or finds:
Prometheus' promtool (the alert rules and their unit tests), Node.js (the API's page scripts parse).
No broker, no database."""
