"""The web dashboard's inside: routes, pages, operator actions, sign-in and
its throttle, the Host allow-list. The public entry is
:mod:`aiogroupq.dashboard`; it stands on the roles and the wings."""
