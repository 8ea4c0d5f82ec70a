"""The spawn form (gpulab.spawn.form): what each GPU's row says to members and to admins,
and the HTML rendered from the template, autoescaped, read back with html.parser (the
browser's view of it: tests/integration/test_claims.py, test_swarm_hub.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from html.parser import HTMLParser

from gpulab.gpus.allocator import Gpu, Lease
from gpulab.spawn.form import GpuRow, SpawnForm, gpu_rows, render_spawn_form

T = datetime(2026, 1, 1, tzinfo=UTC)
EXCLUSIVE = Gpu(0, "GPU-a", "A100")
SHARED = Gpu(1, "GPU-b", "L40S", pool="shared", mode="shared", max_users=2)
IDLE = Gpu(2, "GPU-c", "A100")
HOLDERS = {"GPU-a": [Lease("GPU-a", "alice", "", T)],
           "GPU-b": [Lease("GPU-b", "bob", "train", T)]}


class Page(HTMLParser):
    """The form as a browser reads it: options, cells per row, the paragraphs by id."""

    def __init__(self, html: str):
        super().__init__()
        self.options, self.selected, self.rows, self.head, self.paragraphs = [], [], [], [], {}
        self._where, self._text = None, ""
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "option":
            self.options.append(attrs["value"])
            if "selected" in attrs:
                self.selected.append(attrs["value"])
        elif tag == "tr":
            self.rows.append([])
        self._where, self._text = (tag, attrs.get("id")), ""

    def handle_data(self, data):
        self._text += data

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            (self.head if tag == "th" else self.rows[-1]).append(self._text)
        elif tag == "p":
            self.paragraphs[self._where[1]] = self._text
        self._text = ""


def test_members_see_whether_a_gpu_is_free_admins_who_holds_it():
    assert gpu_rows([EXCLUSIVE, SHARED, IDLE], HOLDERS, is_admin=False) == (
        GpuRow(0, "A100", "default", "in use"),
        GpuRow(1, "L40S", "shared", "shared (1/2)"),
        GpuRow(2, "A100", "default", "free"))
    assert [r.status for r in gpu_rows([EXCLUSIVE, SHARED, IDLE], HOLDERS, is_admin=True)] == [
        "held by alice", "held by bob/train", "free"]


def test_a_member_sees_which_of_her_servers_holds_a_gpu():
    assert [r.status for r in gpu_rows([EXCLUSIVE, SHARED, IDLE], HOLDERS, is_admin=False,
                                       member="bob")] == ["in use", "yours (train)", "free"]
    assert [r.status for r in gpu_rows([EXCLUSIVE, SHARED, IDLE], HOLDERS, is_admin=False,
                                       member="alice")][0] == "yours (your default server)"


def test_the_form_offers_zero_to_the_quota_with_the_default_chosen():
    rows = gpu_rows([EXCLUSIVE, SHARED, IDLE], HOLDERS, is_admin=False)
    page = Page(render_spawn_form(SpawnForm(2, 1, rows, "A server holding GPUs is stopped.")))
    assert page.options == ["0", "1", "2"] and page.selected == ["1"]
    assert page.head == ["GPU", "Model", "Pool", "Status"]
    assert page.rows[1:] == [["0", "A100", "default", "in use"],
                             ["1", "L40S", "shared", "shared (1/2)"],
                             ["2", "A100", "default", "free"]]
    assert page.paragraphs == {"gpulab-culling": "A server holding GPUs is stopped."}


def test_where_the_lab_sends_email_the_line_asks_for_an_address():
    rows = gpu_rows([EXCLUSIVE], HOLDERS, is_admin=False)
    html = render_spawn_form(SpawnForm(1, 1, rows, line=True, waiting=2, email=True))
    assert 'name="wait"' in html and 'type="email" id="gpulab-email" name="email"' in html
    without = render_spawn_form(SpawnForm(1, 1, rows, line=True, waiting=2))
    assert 'name="wait"' in without and 'name="email"' not in without
    # no line, no address
    assert 'name="email"' not in render_spawn_form(SpawnForm(1, 1, rows, email=True))


def test_the_form_says_what_a_server_gets_and_takes_fewer_cpus_or_less_memory():
    rows = gpu_rows([EXCLUSIVE], HOLDERS, is_admin=False)
    said = "A server gets 2 CPUs and 8 GB of memory."
    page = Page(render_spawn_form(SpawnForm(1, 1, rows, resources=said)))
    assert page.paragraphs["gpulab-resources"] == said
    html = render_spawn_form(SpawnForm(1, 1, rows, resources=said))
    assert 'name="cpus"' in html and 'name="memory"' in html
    assert 'name="cpus"' not in render_spawn_form(SpawnForm(1, 1, rows))


def test_on_a_swarm_the_form_names_each_gpus_machine_and_where_the_server_goes():
    rows = gpu_rows([Gpu(0, "GPU-a", "A100", node="n1", machine="gpu-1")], {}, is_admin=False)
    page = Page(render_spawn_form(SpawnForm(1, 0, rows, landing="Your server would start "
                                            "with no GPU on gpu-1.")))
    assert page.head == ["Machine", "GPU", "Model", "Pool", "Status"]
    assert page.rows[1:] == [["gpu-1", "0", "A100", "default", "free"]]
    assert page.paragraphs["gpulab-machine"] == "Your server would start with no GPU on gpu-1."


def test_every_value_is_escaped():
    evil = "<script>alert(1)</script>"
    form = SpawnForm(1, 0, (GpuRow(0, evil, evil, f"held by {evil}", evil),), evil, evil)
    html = render_spawn_form(form)
    assert "<script>" not in html and html.count("&lt;script&gt;") == 6
    page = Page(html)
    assert page.rows[1] == [evil, "0", evil, evil, f"held by {evil}"]
