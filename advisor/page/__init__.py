"""The Streamlit page: ``advisor.page.app`` is the script ``streamlit run`` executes (``advisor page`` starts it
from the installed package; the repository's ``app.py`` runs the same page). Importing this package imports no
Streamlit: ``advisor.page.launch`` runs without it."""
