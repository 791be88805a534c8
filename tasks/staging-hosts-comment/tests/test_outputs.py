from pathlib import Path

EXPECTED = """# Inventory of application hosts.
[production]
web-1.prod.example.com
web-2.prod.example.com  # primary
db-1.prod.example.com

[staging-old]
web-1.stage-old.example.com

[staging]
# web-1.stage.example.com
#   web-2.stage.example.com
# db is shared with dev
# api.stage.example.com  ansible_port=2222

[dev]
web-1.dev.example.com
[staging.backup]
backup-1.stage.example.com
[staging]
# cache-1.stage.example.com
"""


def test_only_staging_hosts_commented():
    assert Path("/etc/app/hosts.ini").read_text() == EXPECTED
