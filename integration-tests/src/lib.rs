//! Nothing here: the tests are under `tests/`.
