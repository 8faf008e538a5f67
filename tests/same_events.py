"""The check both fast-path suites hold their events to: a fast path's events are the general path's."""

from __future__ import annotations

from kvwatch.core.events import Event, event_to_json


def identical_events(fast: tuple[Event, ...], general: tuple[Event, ...]) -> None:
    """Equal as pydantic compares them, and in every attribute pydantic keeps besides."""
    assert fast == general
    for a, b in zip(fast, general, strict=True):
        assert type(a) is type(b)
        assert list(a.__dict__.items()) == list(b.__dict__.items())
        assert a.model_fields_set == b.model_fields_set
        assert (a.__pydantic_extra__, a.__pydantic_private__) == (
            b.__pydantic_extra__,
            b.__pydantic_private__,
        )
        assert event_to_json(a) == event_to_json(b)
        assert a.model_dump(exclude_unset=True) == b.model_dump(exclude_unset=True)
