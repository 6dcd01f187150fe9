"""Redis, Lua and partitions: key names, the scripts and their replies,
clients, codecs and the caps every role shares. Knows no role and no other
wing; everything else stands on it."""
