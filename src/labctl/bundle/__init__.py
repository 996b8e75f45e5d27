"""The offline bundle: everything an air-gapped target installs, signed."""
