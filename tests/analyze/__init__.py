"""Tests of ``mismatch-ctrl analyze``: slime's dump format (read and write), statistics, replay, report and CLI."""
