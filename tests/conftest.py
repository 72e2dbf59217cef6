"""The suite's root: pytest puts this directory on ``sys.path``, so every test directory can import the shared
helpers here (``reference``: the straightforward per-sequence implementations; ``import_graph``; ``fake_group``;
``measure``)."""
