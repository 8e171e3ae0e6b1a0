"""``save_hparams_to_tags_csv`` / ``load_hparams_from_tags_csv``: the file and the values Lightning 2.6.6 writes
and reads back (recorded with the same dict)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from trainer.core.saving import load_hparams_from_tags_csv, save_hparams_to_tags_csv

HPARAMS = {"batch_size": 32, "lr": 0.001, "name": "abc", "flag": True, "off": False, "lst": [1, 2], "none": None,
           "f": "1e-3"}
# What Lightning 2.6.6 wrote for HPARAMS, and what it read back.
LIGHTNING_FILE = 'key,value\nbatch_size,32\nlr,0.001\nname,abc\nflag,True\noff,False\nlst,"[1, 2]"\nnone,\nf,1e-3\n'
LIGHTNING_READ = {"batch_size": 32, "lr": 0.001, "name": "abc", "flag": True, "off": False, "lst": [1, 2],
                  "none": "", "f": 0.001}


def test_tags_csv_round_trip_as_lightning(tmp_path: Any) -> None:
    path = tmp_path / "tags.csv"
    save_hparams_to_tags_csv(path, HPARAMS)
    assert path.read_text() == LIGHTNING_FILE
    assert load_hparams_from_tags_csv(path) == LIGHTNING_READ
    save_hparams_to_tags_csv(path, argparse.Namespace(a=1))
    assert load_hparams_from_tags_csv(path) == {"a": 1}


def test_missing_file_and_folder(tmp_path: Any) -> None:
    with pytest.warns(RuntimeWarning, match="Missing Tags"):
        assert load_hparams_from_tags_csv(tmp_path / "none.csv") == {}
    with pytest.raises(RuntimeError, match="Missing folder"):
        save_hparams_to_tags_csv(tmp_path / "nodir" / "tags.csv", HPARAMS)


def test_values_are_literals_never_code(tmp_path: Any) -> None:
    path = tmp_path / "tags.csv"
    path.write_text("key,value\nx,__import__('os').getcwd()\n")
    assert load_hparams_from_tags_csv(path) == {"x": "__import__('os').getcwd()"}
