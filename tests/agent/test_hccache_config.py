"""The --hccache-* flags: sizes parsed, bad values refused naming the field."""

from __future__ import annotations

import pytest
from hycache_agent.cli import build_parser
from hycache_agent.config import load_config


def test_hccache_flags_parse_sizes_and_defaults(tmp_path):
    c = load_config(None, {"root": tmp_path, "mountpoint": tmp_path / "m"})
    assert (c.hccache_size, c.hccache_mode, c.hccache_small_file, c.hccache_block_size) == \
        (256 << 20, "hybrid", 256 << 10, 128 << 10)
    args = build_parser().parse_args(["mount", "r", "m", "--hccache-size", "0", "--hccache-mode", "block",
                                      "--hccache-small-file", "64K", "--hccache-block-size", "32K",
                                      "--no-hccache-second-level"])
    c = load_config(None, {"root": tmp_path, "mountpoint": tmp_path / "m", "hccache_size": args.hccache_size,
                           "hccache_mode": args.hccache_mode, "hccache_small_file": args.hccache_small_file,
                           "hccache_block_size": args.hccache_block_size,
                           "hccache_second_level": args.hccache_second_level})
    assert (c.hccache_size, c.hccache_mode, c.hccache_small_file, c.hccache_block_size,
            c.hccache_second_level) == (0, "block", 64 << 10, 32 << 10, False)


@pytest.mark.parametrize("field,value", [("hccache_size", "lots"), ("hccache_mode", "lru"),
                                         ("hccache_block_size", "0")])
def test_bad_hccache_values_name_the_field(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        load_config(None, {"root": tmp_path, "mountpoint": tmp_path / "m", field: value})
