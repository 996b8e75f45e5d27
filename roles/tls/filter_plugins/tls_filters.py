"""The tls role's filters."""

from __future__ import annotations

import calendar
import ipaddress
import time
from typing import Any


def labctl_tls_sans(names: list[str]) -> list[str]:
    """subjectAltName entries for names: IP:<address> for an address, DNS:<name> otherwise."""
    sans: list[str] = []
    for name in names:
        text = str(name).strip()
        if not text:
            continue
        try:
            entry = f"IP:{ipaddress.ip_address(text)}"
        except ValueError:
            entry = f"DNS:{text}"
        if entry not in sans:
            sans.append(entry)
    return sans


def labctl_tls_epoch(asn1_time: str) -> int:
    """Unix time of an ASN.1 time as community.crypto reports it (20271231235959Z, UTC)."""
    return calendar.timegm(time.strptime(str(asn1_time), "%Y%m%d%H%M%SZ"))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"labctl_tls_epoch": labctl_tls_epoch, "labctl_tls_sans": labctl_tls_sans}
