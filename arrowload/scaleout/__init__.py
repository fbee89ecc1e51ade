"""Scaling out on Ray, an existing engine (the ``ray`` extra): ``Dataset.to_ray()``
(:mod:`.datasource`) and the loader's ``executor="ray"`` (:mod:`.executor`). Nothing here
is imported by ``import arrowload``; ``ray`` itself is imported on first use
(:func:`.runtime.import_ray`)."""
