"""The ``rlock`` management command."""
