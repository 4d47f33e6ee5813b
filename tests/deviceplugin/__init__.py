"""Tests of device-plugin mode (a package so module names never clash with other test dirs)."""
