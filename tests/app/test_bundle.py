"""The Linux bundle that `tauri build --bundles deb` made: its package metadata (name, version, architecture,
the libraries the app loads), its desktop entry (which names an executable and an icon the package holds),
and that the packaged executable, unpacked (`dpkg-deb -x`, nothing installed), starts: its node answers
and its dashboard window comes on screen.

Run by scripts/test-app under Xvfb and a D-Bus session, after it built the package."""

import configparser
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from ports import free_base_port  # noqa: E402
from webdriver import wait  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = os.path.join(ROOT, "src-tauri", "tauri.conf.json")
OUT = os.path.join(ROOT, "tests", "app", "out")


def control_fields(deb):
    """The package's control file as a dict (dpkg-deb -f prints it)."""
    text = subprocess.run(["dpkg-deb", "-f", deb], check=True, capture_output=True, text=True).stdout
    fields, key = {}, None
    for line in text.splitlines():
        if line.startswith((" ", "\t")) and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


def desktop_entry(root):
    entries = glob.glob(os.path.join(root, "usr/share/applications/*.desktop"))
    assert len(entries) == 1, f"one desktop entry, not {entries}"
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(entries[0])
    return parser["Desktop Entry"]


def health(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=5) as response:
        return json.loads(response.read())["ok"]


def main():
    config = json.load(open(CONFIG))
    debs = glob.glob(os.path.join(ROOT, "target", "release", "bundle", "deb", f"*_{config['version']}_*.deb"))
    assert len(debs) == 1, f"one .deb of version {config['version']} in target/release/bundle/deb, not {debs}"
    deb = debs[0]

    fields = control_fields(deb)
    assert fields["Package"] == config["productName"], fields
    assert fields["Version"] == config["version"], fields
    arch = subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True, text=True).stdout.strip()
    assert fields["Architecture"] == arch, fields
    depends = fields.get("Depends", "")
    for library in ("libwebkit2gtk-4.1-0", "libgtk-3-0", "libayatana-appindicator3-1"):
        assert library in depends, f"Depends lacks {library}: {depends}"
    print(f"{os.path.basename(deb)}: {fields['Package']} {fields['Version']} {fields['Architecture']}, "
          f"Depends: {depends}")

    root = tempfile.mkdtemp(prefix="shoal-deb-")
    work = tempfile.mkdtemp(prefix="shoal-bundle-test-")
    app = None
    try:
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
        entry = desktop_entry(root)
        assert entry["Type"] == "Application" and entry["Name"] == config["productName"], dict(entry)
        assert entry.get("Categories", "").startswith("Utility"), dict(entry)
        exe = os.path.join(root, "usr", "bin", entry["Exec"].split()[0])
        assert os.access(exe, os.X_OK), f"the entry's Exec={entry['Exec']} is not an executable in usr/bin"
        icons = glob.glob(os.path.join(root, "usr/share/icons/hicolor/*/apps", entry["Icon"] + ".png"))
        assert icons, f"no icon {entry['Icon']}.png in the package"
        # Icon themes look only in size directories named NxN.
        sizes = [os.path.basename(os.path.dirname(os.path.dirname(icon))) for icon in icons]
        assert all(s.split("x")[0].isdigit() and s.split("x") == [s.split("x")[0]] * 2 for s in sizes), sizes
        print(f"desktop entry: Exec={entry['Exec']} Icon={entry['Icon']} ({len(icons)} sizes) "
              f"Categories={entry['Categories']}")

        # The node's API port and its cluster port after it.
        port = free_base_port(int(os.environ.get("SHOAL_BUNDLE_TEST_PORT", "17560")), 2)
        env = dict(os.environ, SHOAL_DATA_DIR=os.path.join(work, "node"), SHOAL_PORT=str(port), SHOAL_NO_MDNS="1",
                   SHOAL_NAME="packaged")
        os.makedirs(OUT, exist_ok=True)
        log = os.path.join(OUT, "bundle-app.log")
        app = subprocess.Popen([exe], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        wait("the packaged app's node", lambda: app.poll() is None and health(port), timeout=60)
        wait("the packaged app's window on screen", lambda: subprocess.run(
            ["xdotool", "search", "--onlyvisible", "--name", "^shoal$"], capture_output=True, text=True).stdout.split(),
            timeout=30)
        assert app.poll() is None, f"the packaged app exited with {app.returncode}: see {log}"
        print("the packaged executable starts: its node answers and its window is on screen")
    finally:
        if app is not None and app.poll() is None:
            app.terminate()
            try:
                app.wait(timeout=10)
            except subprocess.TimeoutExpired:
                app.kill()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print("bundle tests passed")


if __name__ == "__main__":
    main()
