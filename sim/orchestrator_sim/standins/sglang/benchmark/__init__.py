"""SGLang's benchmark package (stand-in): `serving` is the online benchmark from 0.5.15."""
