"""Unit tests of the framework-free core. A package, so pytest puts tests/ on sys.path (reference.py, fake_group.py)
and these module names cannot clash with test files of the same name elsewhere under tests/."""
