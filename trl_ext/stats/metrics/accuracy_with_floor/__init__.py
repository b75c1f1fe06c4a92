"""The ``accuracy_with_floor`` evaluate metric (see ``accuracy_with_floor.py``)."""
