"""What the library tells the world: task events and observers, and the log
setup and line formats. Imports only the face and ``_store``, so every role
and wing may use it."""
