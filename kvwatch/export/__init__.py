"""Exposition: how kvwatch's metric samples become the bytes a scrape returns."""
