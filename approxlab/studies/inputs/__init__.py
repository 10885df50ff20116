"""The inputs the studies share: WikiText-2 windows and their Q/K/V and exact references
(:mod:`.wikitext`), and the generated LRA tasks (:mod:`.tasks`)."""
