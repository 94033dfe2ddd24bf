"""The real app window, driven through tauri-driver and WebKitWebDriver: with a model running on the app's
node, the tray's Quit first asks in the window what quitting stops (Cancel keeps the app, Quit anyway ends
it); the window shows this machine's node; a node started beside it (joined with a code) appears; the Join
form joins another cluster with its code. Then desktop notifications: none while the window has focus, one
per event while it is out of sight. Then the tray: its menu opens and Quit ends the app with status 0 and
stops its node.

Every wait polls for the state it needs (`wait`), and every "this does not happen" is checked only after
something observable shows that the app has dealt with what could have made it happen.

Run by scripts/test-app under Xvfb and a D-Bus session; needs target/release/shoal and shoal-app."""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from ports import free_base_port  # noqa: E402
from webdriver import Session, wait  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHOAL = os.path.join(ROOT, "target", "release", "shoal")
APP = os.path.join(ROOT, "target", "release", "shoal-app")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "app", "out")

BASE_PORT = free_base_port(int(os.environ.get("SHOAL_APP_TEST_PORT", "17600")), 62)
APP_PORT, BESIDE_PORT, OTHER_PORT, TRAY_PORT = BASE_PORT, BASE_PORT + 10, BASE_PORT + 20, BASE_PORT + 30
QUIT_PORT, LOOKOUT_PORT, STUDIO_PORT = BASE_PORT + 40, BASE_PORT + 50, BASE_PORT + 60


def api(port, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


class Processes:
    def __init__(self):
        self.started = []

    def start(self, args, log, env=None):
        process = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        self.started.append(process)
        return process

    def stop_all(self):
        for process in self.started:
            if process.poll() is None:
                process.terminate()
        for process in self.started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def node(processes, work, name, port, join=None):
    args = [SHOAL, "node", "--data-dir", os.path.join(work, name), "--port", str(port), "--no-mdns", "--name", name]
    if join:
        args += ["--join", join]
    process = processes.start(args, os.path.join(OUT, f"{name}.log"))
    wait(f"{name}'s API", lambda: api(port, "/api/health")["ok"])
    return process


def card_names(session):
    return session.script(
        "return [...document.querySelectorAll('[data-testid=node-card]')]"
        ".map(c => c.querySelector('h3, h2, .name')?.textContent?.trim() ?? c.textContent)"
    )


def test_window(processes, work):
    env = dict(os.environ, SHOAL_DATA_DIR=os.path.join(work, "desk"), SHOAL_PORT=str(APP_PORT), SHOAL_NO_MDNS="1",
               SHOAL_NAME="desk")
    processes.start(["tauri-driver", "--port", "4444"], os.path.join(OUT, "tauri-driver.log"), env=env)
    session = Session("http://127.0.0.1:4444", APP)
    try:
        names = session.wait_for("the window to show this machine's node", lambda: card_names(session), timeout=30)
        assert len(names) == 1 and "desk" in names[0], names
        print("window shows the local node:", names)

        code = api(APP_PORT, "/api/cluster/code", {})["code"]
        node(processes, work, "beside", BESIDE_PORT, join=f"{code}@127.0.0.1:{APP_PORT + 1}")
        names = session.wait_for("the node started beside it", lambda: (n := card_names(session)) and len(n) == 2 and n)
        assert any("beside" in n for n in names), names
        print("a node started beside it appears:", names)

        node(processes, work, "other", OTHER_PORT)
        other = api(OTHER_PORT, "/api/cluster")
        code = api(OTHER_PORT, "/api/cluster/code", {})["code"]
        session.script("location.hash = '#/mesh/join'")
        field = session.wait_for("the join form", lambda: session.find_all("[data-testid=join-form] input"))[0]
        session.type(field, f"{code}@127.0.0.1:{OTHER_PORT + 1}")
        session.click(session.find_all("[data-testid=join-form] button[type=submit]")[0])
        wait("the app's node to join the other cluster",
             lambda: api(APP_PORT, "/api/cluster")["cluster_id"] == other["cluster_id"], timeout=30)
        names = session.wait_for(
            "the window to show the joined cluster",
            lambda: (n := card_names(session)) and any("other" in x for x in n) and not any("beside" in x for x in n) and n,
        )
        print("Join with a code joined:", names)
        session.script("location.hash = '#/mesh'")
        session.wait_for("the mesh to draw the joined cluster (for the screenshot)", lambda: session.script(
            "return document.querySelectorAll('[data-testid=mesh-node]').length === 2"
            " && document.querySelectorAll('[data-testid=link]').length === 1"))
        try:
            session.screenshot(os.path.join(OUT, "app.png"))
        except Exception as e:  # a picture for people, not something the test checks
            print(f"no screenshot of the window: {e}")
    finally:
        session.close()


def x_windows():
    tree = subprocess.run(["xwininfo", "-root", "-tree"], capture_output=True, text=True).stdout
    return tree


def visible_app_windows():
    """The app's X windows that are on screen now (its dashboard window, its tray menu when open)."""
    return set(subprocess.run(["xdotool", "search", "--onlyvisible", "--class", "shoal-app"],
                              capture_output=True, text=True).stdout.split())


class X:
    """One connection to the X server through Xlib, kept for the whole test: an X server resets when its
    last client leaves, and refuses the clients that connect meanwhile (a trayer starting then fails)."""
    xlib = None
    display = None

    @classmethod
    def connection(cls):
        if cls.display is None:
            xlib = ctypes.CDLL("libX11.so.6")
            xlib.XOpenDisplay.restype = ctypes.c_void_p
            xlib.XOpenDisplay.argtypes = [ctypes.c_char_p]
            xlib.XInternAtom.restype = ctypes.c_ulong
            xlib.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
            xlib.XGetSelectionOwner.restype = ctypes.c_ulong
            xlib.XGetSelectionOwner.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
            display = xlib.XOpenDisplay(None)
            if not display:
                raise OSError(f"cannot open the X display {os.environ.get('DISPLAY')!r}")
            cls.xlib, cls.display = xlib, display
        return cls.xlib, cls.display


def tray_owned():
    """Whether a system tray serves this screen: someone owns the selection _NET_SYSTEM_TRAY_S0, which
    the system tray protocol has a tray take before icons can dock."""
    xlib, display = X.connection()
    return xlib.XGetSelectionOwner(display, xlib.XInternAtom(display, b"_NET_SYSTEM_TRAY_S0", 0)) != 0


def start_trayer(processes, log):
    """A system tray (trayer) for the app's icon to sit in; returns once it serves the screen. Stop it
    with `stop_trayer`, so that the next one does not start while this one still holds the tray."""
    assert not tray_owned(), "another system tray serves this screen"
    trayer = processes.start(["trayer", "--edge", "top", "--align", "right", "--widthtype", "request", "--height", "32",
                              "--transparent", "false", "--tint", "0x333333"], os.path.join(OUT, log))
    wait("trayer to take the system tray", tray_owned, timeout=10)
    return trayer


def stop_trayer(trayer):
    trayer.terminate()
    trayer.wait(timeout=10)


def tray_quit(screenshot=None):
    """Opens the tray menu (the only tray icon) and picks Quit, its last item; `screenshot`: where to
    save the screen with the menu open."""
    icons = wait("one tray icon", lambda: (i := [l for l in x_windows().splitlines() if "tray-icon tray app" in l])
                 and len(i) == 1 and i)
    # "… 32x30+0+0  +1366+1": the icon's absolute position is the last field.
    x, y = (int(v) for v in icons[0].split()[-1].lstrip("+").split("+"))
    before = visible_app_windows()
    subprocess.run(["xdotool", "mousemove", str(x + 10), str(y + 10), "click", "1"], check=True)
    wait("the tray menu on screen", lambda: visible_app_windows() - before, timeout=10)
    if screenshot:
        subprocess.run(["import", "-window", "root", screenshot], check=False)
    # GTK grabs the keyboard for a menu before it maps it, so keys sent now go to the menu, in order.
    # Quit is the menu's last item: Up from nothing selects it.
    subprocess.run(["xdotool", "key", "Up", "Return"], check=True)


def app_workers():
    """The pids of the app's model workers still running (`shoal-app worker …`)."""
    running = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args[0] == APP.encode() and len(args) > 1 and args[1] == b"worker":
            running.append(int(pid))
    return running


def test_quit_asks_first(processes, work):
    """A model runs on the app's node: the tray's Quit shows the window asking first, naming the model;
    Cancel keeps the app and its model; Quit anyway ends the app and its node."""
    trayer = start_trayer(processes, "trayer-quit.log")
    env = dict(os.environ, SHOAL_DATA_DIR=os.path.join(work, "quitter"), SHOAL_PORT=str(QUIT_PORT), SHOAL_NO_MDNS="1",
               SHOAL_NAME="quitter", SHOAL_RUN=MODEL)
    processes.start(["tauri-driver", "--port", "4446", "--native-port", "4447"], os.path.join(OUT, "tauri-driver-quit.log"), env=env)
    session = Session("http://127.0.0.1:4446", APP)
    try:
        wait("the model to run on the app's node",
             lambda: any(i["state"] == "ready" for i in api(QUIT_PORT, "/api/instances")), timeout=90)
        assert app_workers(), "the model runs, yet no `shoal-app worker` process was found"
        dialog = "[data-testid=quit-dialog]"
        message = "[data-testid=quit-message]"
        tray_quit()
        shown = session.wait_for("the window to ask before quitting",
                                 lambda: (m := session.find_all(message)) and session.text(m[0]))
        assert "SmolLM2-135M-Instruct.Q4_1 on this node" in shown, shown
        # The tray's Quit either asks (shows the window) or quits; the question on screen shows it chose to
        # ask. That the app does not quit anyway a little later is checked below, after each later step the
        # app has to be running for (the Cancel click, the question closing, a second tray menu).
        assert api(QUIT_PORT, "/api/health")["ok"], "the app quit without waiting for an answer"
        session.screenshot(os.path.join(OUT, "quit-asks.png"))
        print("the tray's Quit asks first:", shown)

        session.click(session.find_all("[data-testid=quit-cancel]")[0])
        session.wait_for("the question to close", lambda: not session.find_all(dialog))
        assert api(QUIT_PORT, "/api/health")["ok"], "the app quit without waiting for an answer, or on Cancel"
        assert any(i["state"] == "ready" for i in api(QUIT_PORT, "/api/instances")), "Cancel kept the model running"

        tray_quit()
        shown = session.wait_for("the question again", lambda: (m := session.find_all(message)) and session.text(m[0]))
        # The node worked this answer out after Cancel: the model still ran on it then.
        assert "SmolLM2-135M-Instruct.Q4_1 on this node" in shown, f"Cancel stopped the model: {shown}"
        print("Cancel keeps the app and its model")
        session.click(session.find_all("[data-testid=quit-confirm]")[0])

        def stopped():
            try:
                api(QUIT_PORT, "/api/health")
                return False
            except OSError:
                return True

        wait("Quit anyway to end the app and its node", stopped, timeout=20)
        wait("the model's worker to end with the app", lambda: not app_workers(), timeout=20)
        print("Quit anyway ended the app, its node and its model's worker")
    finally:
        session.close()
        stop_trayer(trayer)


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


FOCUSED = "the dashboard window has focus"
UNFOCUSED = "the dashboard window lost focus"


def app_sees_focus(app_log):
    """What the app last said about its window's focus (it logs each change): FOCUSED, UNFOCUSED or None."""
    said = [line for line in read(app_log).splitlines() if FOCUSED in line or UNFOCUSED in line]
    return None if not said else FOCUSED if FOCUSED in said[-1] else UNFOCUSED


def join_tray_app(processes, work, name, port):
    code = api(TRAY_PORT, "/api/cluster/code", {})["code"]
    node(processes, work, name, port, join=f"{code}@127.0.0.1:{TRAY_PORT + 1}")


def test_notifications(processes, work, app_log, app_pid):
    """Desktop notifications, seen as D-Bus Notify calls to the notification server (dunst here) by
    dbus-monitor. While the window has focus, a node joining makes none; with the window out of sight,
    a node joining makes exactly one."""
    log = os.path.join(OUT, "notifications.log")
    monitor = processes.start(["dbus-monitor", "interface='org.freedesktop.Notifications',member='Notify'"], log)
    # The bus takes a connection's name when it becomes a monitor: from NameLost on, the calls are seen.
    wait("dbus-monitor to watch the bus", lambda: "member=NameLost" in read(log))
    # This app's windows only (GTK sets _NET_WM_PID): the window-test app that WebDriver closed just
    # before may still be on screen (CI once saw two windows named shoal here).
    windows = wait("the app window on screen", lambda: subprocess.run(
        ["xdotool", "search", "--all", "--onlyvisible", "--pid", str(app_pid), "--name", "^shoal$"],
        capture_output=True, text=True).stdout.split())
    assert len(windows) == 1, f"one window named shoal, not {windows}"

    # With no window manager, the window takes the X input focus from xdotool; the app logs what it saw.
    subprocess.run(["xdotool", "windowfocus", "--sync", windows[0]], check=True)
    wait("the app to see its window focused", lambda: app_sees_focus(app_log) == FOCUSED)
    join_tray_app(processes, work, "lookout", LOOKOUT_PORT)
    # The app logs what it did with the notice: shown ("notified: …") or held back because of the focus.
    decided = wait("the app to deal with the notice that lookout joined", lambda: [
        line for line in read(app_log).splitlines() if "lookout joined the cluster" in line])
    held = all("not notifying while the dashboard has focus" in line for line in decided)
    assert held, f"a notification while the window had focus: {decided}"
    assert "lookout joined the cluster" not in read(log), "a Notify call while the window had focus"
    print("no notification while the window has focus; the app:", decided[0][decided[0].index("not notifying"):])

    for w in windows:
        subprocess.run(["xdotool", "windowunmap", "--sync", w], check=True)
    wait("the app to see its window lose focus", lambda: app_sees_focus(app_log) == UNFOCUSED)
    join_tray_app(processes, work, "studio", STUDIO_PORT)
    wait("a notification that studio joined", lambda: "studio joined the cluster" in read(log), timeout=15)
    # The app deals with events in order: once lookout leaving is notified, whatever studio joining
    # called for has been done.
    api(LOOKOUT_PORT, "/api/cluster/leave", {})
    wait("a notification that lookout left", lambda: "lookout left the cluster" in read(log), timeout=15)
    assert read(log).count("studio joined the cluster") == 1, "one notification per event"
    monitor.terminate()
    print("with the window out of sight, a node joining made one desktop notification")


def test_tray(processes, work):
    trayer = start_trayer(processes, "trayer.log")
    env = dict(os.environ, SHOAL_DATA_DIR=os.path.join(work, "tray"), SHOAL_PORT=str(TRAY_PORT), SHOAL_NO_MDNS="1")
    app_log = os.path.join(OUT, "tray-app.log")
    app = processes.start([APP], app_log, env=env)
    wait("the app's node", lambda: api(TRAY_PORT, "/api/health")["ok"])
    test_notifications(processes, work, app_log, app.pid)
    tray_quit(screenshot=os.path.join(OUT, "tray-menu.png"))
    code = app.wait(timeout=20)
    assert code == 0, f"Quit ended the app with status {code}; the app's log ends:\n" + "\n".join(
        read(app_log).splitlines()[-30:])
    try:
        api(TRAY_PORT, "/api/health")
        raise AssertionError("the node still answers after Quit")
    except OSError:
        pass
    print("tray menu opened; Quit exited with status 0 and stopped the node")
    stop_trayer(trayer)


def main():
    os.makedirs(OUT, exist_ok=True)
    for binary in (SHOAL, APP):
        if not os.path.exists(binary):
            sys.exit(f"{binary} is missing: build it first (scripts/test-app does)")
    if not os.path.exists(MODEL):
        sys.exit(f"{MODEL} is missing: run scripts/fetch-test-model --default-only (scripts/test-app does)")
    work = tempfile.mkdtemp(prefix="shoal-app-test-")
    processes = Processes()
    try:
        test_quit_asks_first(processes, work)
        test_window(processes, work)
        test_tray(processes, work)
    finally:
        processes.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    print("app tests passed")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
