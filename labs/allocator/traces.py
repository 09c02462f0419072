"""The worked examples of lab 3: traces (in the format of ``labs.allocator.model.replay``) that the
notebook walks through and the exercises' first checks replay, so the two cannot drift apart."""

MiB = 1024**2

#: section 3: small requests share a 2 MiB segment; a 5 MiB request splits a 20 MiB one whose
#: remainder a 12 MiB request then splits; freed blocks are reused by best fit; a 2 MiB request
#: takes a whole 3 MiB block (1 MiB would remain: no split); 16 MiB gets a segment of its own
BEST_FIT = [
    ("malloc", 1, 1000, 0),
    ("malloc", 2, 3000, 0),
    ("malloc", 3, 5 * MiB, 0),
    ("malloc", 4, 12 * MiB, 0),
    ("free", 1),
    ("malloc", 5, 700, 0),
    ("malloc", 6, 9 * MiB, 0),
    ("free", 3),
    ("malloc", 7, 2 * MiB, 0),
    ("malloc", 8, 16 * MiB, 0),
]

#: section 4: four small blocks freed out of order merge back into one segment; empty_cache frees
#: it only once it is whole
COALESCE = [("malloc", h, 300_000, 0) for h in (1, 2, 3, 4)] + [
    ("free", 2),
    ("free", 4),
    ("empty_cache",),
    ("free", 3),
    ("free", 1),
    ("empty_cache",),
]

#: section 4: on a 100 MiB GPU, a cached 30 MiB segment is freed to make room for 50 MiB; 80 MiB
#: then fails even after the retry
OUT_OF_MEMORY = [
    ("malloc", 1, 30 * MiB, 0),
    ("malloc", 2, 30 * MiB, 0),
    ("free", 1),
    ("malloc", 3, 50 * MiB, 0),
    ("malloc", 4, 80 * MiB, 0),
]

#: section 5: streams do not share cached blocks; a block used on stream 1 is pending free until
#: stream 1's work is done
STREAMS = [
    ("malloc", 1, 4 * MiB, 0),
    ("free", 1),
    ("malloc", 2, 4 * MiB, 1),
    ("malloc", 3, 4 * MiB, 0),
    ("use", 3, 1),
    ("free", 3),
    ("malloc", 4, 4 * MiB, 0),
    ("sync", 1),
    ("malloc", 5, 4 * MiB, 0),
]

#: section 6: 18 MiB are cached but split around a live 2 MiB block, so a 12 MiB request finds
#: no block, and no room, on a 100 MiB GPU
FRAGMENTED = [
    ("malloc", 1, 8 * MiB, 0),
    ("malloc", 2, 2 * MiB, 0),
    ("malloc", 3, 8 * MiB, 0),
    ("malloc", 4, 100_000, 0),
    ("free", 1),
    ("free", 3),
    ("malloc", 5, 78 * MiB, 0),
    ("malloc", 6, 12 * MiB, 0),
]
