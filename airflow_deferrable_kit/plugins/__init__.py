"""The Airflow UI plugin: the **Waits** page, served by the api-server only.

Airflow loads :mod:`~airflow_deferrable_kit.plugins.waits` through the ``airflow.plugins`` entry
point in every component that loads plugins (scheduler, workers, triggerer, api-server). That
module is deliberately tiny: the FastAPI app and everything it reads are imported only when the
api-server asks for its apps, so nothing else pays for the page.

* :mod:`~airflow_deferrable_kit.plugins.waits` the plugin class, the nav entry, the lazy app list;
* :mod:`~airflow_deferrable_kit.plugins._describe` a trigger row as a wait kind and target, never
  its raw kwargs;
* :mod:`~airflow_deferrable_kit.plugins._read` what the page shows, read from the metadata DB;
* :mod:`~airflow_deferrable_kit.plugins._page` the server-rendered HTML;
* :mod:`~airflow_deferrable_kit.plugins._app` the FastAPI app: routes, access checks, filters.
"""
