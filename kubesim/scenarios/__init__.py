"""Scenario files that ship with the simulator (package data)."""
