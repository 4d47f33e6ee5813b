"""GENERATED ONLY: see dra_driver/pb/__init__.py."""
