"""turnlog subpackage."""
