import os

os.environ["HF_HUB_OFFLINE"] = "1"  # a hub call must fail at once, never hang
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
