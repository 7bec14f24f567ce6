"""The MySQL and MariaDB backend (``mysql://`` URLs), on PyMySQL."""
