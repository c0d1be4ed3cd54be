"""How members are decoded: the member extensions chute knows and the kind of
each (``extensions``), the native and Python decoders (``decoders``) and the
image options of ``decode`` (``image_options``)."""
