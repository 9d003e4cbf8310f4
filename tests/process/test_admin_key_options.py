"""--admin-api-key and --admin-api-key-file come from flags, EDGE_SERVER_* variables and
the TOML file like --api-key; --min-free-disk-mb likewise."""

from __future__ import annotations

import argparse
from pathlib import Path

from edge_server.config import add_serve_arguments, resolve_options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser


def test_admin_keys_from_flags_environment_toml_and_file(tmp_path: Path) -> None:
    keys = tmp_path / "admin-keys"
    keys.write_text("# one per line\nfrom-file\n\n")
    config = tmp_path / "edge.toml"
    config.write_text(f'admin-api-key-file = "{keys}"\nmin-free-disk-mb = 64\n')
    parser = _parser()
    opts = resolve_options(parser.parse_args(["--config", str(config), "--admin-api-key",
                                              "from-flag", "--api-key", "user"]), {})
    assert opts.admin_api_keys() == ["from-flag", "from-file"]
    assert opts.api_keys() == ["user"]
    assert opts.min_free_disk_mb == 64
    env = {"EDGE_SERVER_ADMIN_API_KEY": "a,b", "EDGE_SERVER_MIN_FREE_DISK_MB": "0"}
    from_env = resolve_options(parser.parse_args([]), env)
    assert from_env.admin_api_keys() == ["a", "b"] and from_env.api_keys() == []
    assert from_env.min_free_disk_mb == 0
    defaults = resolve_options(parser.parse_args([]), {})
    assert defaults.admin_api_keys() == [] and defaults.min_free_disk_mb == 1024
