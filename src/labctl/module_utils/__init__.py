"""The code labctl shares with the modules that run on the targets.

One route each way between Ansible and this package:

* **Control node** (filter, action and lookup plugins: anything that runs inside
  ``ansible-playbook``): ``import labctl...``, the installed package. Ansible runs from the
  project's venv, where labctl is installed (``make venv``: ``pip install -e``), so every way in
  (``make demo``, molecule, ``labctl provision`` through ansible-runner, which puts labctl's
  own venv first on PATH) finds it. No plugin loads labctl by file path or edits ``sys.path``.
* **Targets** (modules in ``library/`` and ``roles/<role>/library/``): this package, and only
  this package, as ``module_utils``. A role whose modules need it has one entry in
  ``roles/<role>/module_utils/``: the symlink ``labctl -> ../../../src/labctl/module_utils``;
  ``library/``'s modules reach it through the repository's ``module_utils/labctl`` (the same
  symlink, the one ``module_utils`` path ansible.cfg names). Their light calls
  (``action_plugins/labctl_read.py``) send the modules of this package they import with them.
  A module imports ``ansible.module_utils.labctl.<module>``; labctl itself imports
  ``labctl.module_utils.<module>``: one source, no copy. Ansible packs the package with the
  module (AnsiballZ follows the relative imports inside it).

So that it runs on every target Python, each module here imports only the standard library and
its neighbours here (relative imports), and keeps to Python 3.9 syntax.
``tests/unit/test_python_routes.py`` checks all of this: the symlinks, the imports, the syntax,
and that no project Python file outside the tests loads code by path or edits ``sys.path``.

* ``sums``: streaming sha256 of a file, safe relative paths, the SHA256SUMS format.
* ``verifycore``: the bundle's verification (``labctl bundle verify`` and ``labctl_bundle_verify``).
* ``stage_files``, ``stage_progress``, ``stager``: a model revision's staging (``labctl_model_stage``).
"""
