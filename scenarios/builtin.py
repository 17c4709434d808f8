"""Imports the built-in scenarios so that they register themselves."""

import scenarios.delegate
import scenarios.relay
import scenarios.spread
import scenarios.text_delegate
import scenarios.text_toolchain
import scenarios.toolchain  # noqa: F401
