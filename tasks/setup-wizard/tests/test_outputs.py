import json
from pathlib import Path


def test_wizard_wrote_the_config():
    config = json.loads(Path("/etc/wizard/config.json").read_text())
    assert config == {"project": "atlas", "port": 9090, "tls": True, "written_by": "setup-wizard"}
