"""The web dashboard's inside; the public entry is :mod:`aiogroupq.dashboard`."""
