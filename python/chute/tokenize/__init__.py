"""Text shards tokenized into Megatron-LM token files, kept in a cache.

``tokenize_shards(urls, tokenizer, cache_dir)`` turns each input shard (a tar
shard of ``.txt``/``.json`` members, a JSON Lines file or a Parquet file's
string column; local or remote) into one ``.bin`` + ``.idx`` pair in
`cache_dir` and returns the ``.bin`` paths, in the order of `urls`. The
tokenizer is Hugging Face ``tokenizers``' (``pip install 'chute[tokenizers]'``):
its batch encoder runs in Rust on all cores with the GIL released, so a
reading thread parses the next documents while the current batch is encoded.

The package's modules: ``text_shards`` reads the input documents,
``cache_entries`` writes and checks the cache's files, ``build`` drives the
tokenizer.
"""

from chute.tokenize.build import as_tokenizer, id_bound, token_dtype, tokenize_shards
from chute.tokenize.cache_entries import recorded_id_range

__all__ = ["as_tokenizer", "id_bound", "recorded_id_range", "token_dtype", "tokenize_shards"]
