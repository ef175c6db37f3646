"""What an RL trainer needs beside the client: its LoRA adapters as GGUF (`lora`), so the
embedded engine serves what it trains (`update_weights` with `lora_path`); and the rollouts it
stored, as Parquet rows it reads without a tokenizer (`rollouts`)."""
