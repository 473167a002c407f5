"""The Streamlit page from the repository root: ``.venv/bin/streamlit run app.py`` (installed: ``advisor page``).
The page is ``advisor.page.app``; Streamlit executes this file as ``__main__`` on every rerun."""

from advisor.page.app import main

if __name__ == "__main__":
    main()
