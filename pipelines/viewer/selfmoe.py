"""selfmoe in the viewer: its domains with what each filter dropped, and one domain's rows by kind."""
from __future__ import annotations

from flask import Flask, abort, render_template, request

from pipelines.viewer import pictures
from pipelines.viewer.look import Look, TableOf, page_span


def reason_kind(reason: str | None) -> str:
    """A reject reason without its detail: `malformed` of `malformed: fewer than 3 words`; `kept` for none."""
    return "kept" if reason is None else reason.split(":", 1)[0]


def domains(table: TableOf) -> list[dict]:
    """Per domain: seeds, generated rows, kept ones, and the drops by kind (most first)."""
    cols = table("examples").columns(("domain", "source", "kept", "reject_reason")).to_pylist()
    found: dict[str, dict] = {}
    for r in cols:
        d = found.setdefault(r["domain"], {"domain": r["domain"], "seeds": 0, "generated": 0, "kept": 0,
                                           "dropped": {}})
        if r["source"] == "seed":
            d["seeds"] += 1
            continue
        d["generated"] += 1
        if r["kept"]:
            d["kept"] += 1
        else:
            kind = reason_kind(r["reject_reason"])
            d["dropped"][kind] = d["dropped"].get(kind, 0) + 1
    for d in found.values():
        d["dropped"] = dict(sorted(d["dropped"].items(), key=lambda kv: (-kv[1], kv[0])))
    return [found[k] for k in sorted(found)]


def numbers(table: TableOf, domain: str, show: str) -> list[int]:
    """Row numbers of a domain's rows: show = kept (generated and kept), dropped, seed, or a drop kind."""
    cols = table("examples").columns(("domain", "source", "kept", "reject_reason")).to_pylist()
    out = []
    for n, r in enumerate(cols):
        if r["domain"] != domain:
            continue
        if show == "seed":
            wanted = r["source"] == "seed"
        elif r["source"] == "seed":
            wanted = False
        elif show == "kept":
            wanted = bool(r["kept"])
        elif show == "dropped":
            wanted = not r["kept"]
        else:
            wanted = not r["kept"] and reason_kind(r["reject_reason"]) == show
        if wanted:
            out.append(n)
    return out


def listed(row: dict) -> dict:
    """A row as the domain page lists it: the reason's kind and detail apart, and the instruction a
    near-duplicate drop matched (the row's near_duplicate)."""
    reason = row.get("reject_reason")
    return dict(row, kind=reason_kind(reason), detail=(reason or "").partition(": ")[2],
                matched=row.get("near_duplicate"))


class SelfMoELook(Look):
    pictures = ("domains",)

    def overview(self, table, dataset_dir, manifest):
        # a few columns of a small table
        return {"domains": domains(table)} if "examples" in manifest["tables"] else None

    def routes(self, app: Flask, table: TableOf, dataset_dir: str, manifest: dict) -> None:
        @app.route("/selfmoe/<domain>", endpoint="domain")
        def domain(domain: str):
            """One domain's brainstormed instructions: kept ones with their responses, or the drops of
            one kind with each reason (and, for a near-duplicate, the instruction it matched)."""
            counts = next((d for d in domains(table) if d["domain"] == domain), None)
            if counts is None:
                abort(404, f"no domain {domain!r} in this dataset")
            show = request.args.get("show") or "kept"
            if show not in ("kept", "dropped", "seed", *counts["dropped"]):
                abort(400, f"show one of kept, dropped, seed, {', '.join(counts['dropped'])}; not {show!r}")
            found = numbers(table, domain, show)
            page, pages, lo, hi = page_span(request.args.get("page"), len(found))
            shown = found[lo:hi]
            rows = [listed(r) for r in table("examples").rows_at(shown)]
            return render_template("domain.html", m=manifest, domain=domain, counts=counts, show=show,
                                   rows=list(zip(shown, rows)), page=page, pages=pages, total=len(found))

    def picture(self, table, dataset_dir, name, number, view):
        return pictures.domains_chart(domains(table))


LOOK = SelfMoELook()
