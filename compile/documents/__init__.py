"""Typed documents between stages (see base.py); each module holds one document and its parts."""
