"""Running a config on a Ray cluster (`inferlab run CONFIG --cluster ADDRESS`): only this package imports Ray.

- settings.py: the `[cluster]` table (no Ray import: every config reads it);
- driver.py: the driver's side: pairs, tasks, the streamed records, reruns of lost levels, the reports;
- task.py: one (cell, engine) pair on the node Ray placed it on, through the existing runner;
- sink.py: the actor on the driver's node the tasks stream records to;
- preflight.py: every node's commit, versions, models and ports against the driver's, before any cell;
- placement.py: what each task asks for, and the dry run's placement;
- reaper.py: the watcher that kills a task's engines when its process ends;
"""
