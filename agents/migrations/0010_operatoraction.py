"""`OperatorAction` moves from webhooks to agents (issue 44), so that agents' services audit
in their own transaction. State only: the table keeps its name (`webhooks_operatoraction`)
and its rows; webhooks 0009 drops the model from webhooks' state after this one.

Its content type moves with it (renamed in place), so its permissions keep their rows and
codenames, and the groups, users and admin log entries that point at them keep pointing at
them; only their label reads `agents.` now (webhooks/console/operator_groups.py). On a fresh
database there is nothing to rename: post_migrate creates agents' content type."""

from django.db import migrations, models


def _move_content_type(apps, schema_editor, old: str, new: str) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    types = content_type.objects.using(schema_editor.connection.alias)
    if types.filter(app_label=new, model="operatoraction").exists():
        return  # already there (post_migrate made it): the old one is stale, left as it is
    types.filter(app_label=old, model="operatoraction").update(app_label=new)


def content_type_to_agents(apps, schema_editor) -> None:
    _move_content_type(apps, schema_editor, "webhooks", "agents")


def content_type_to_webhooks(apps, schema_editor) -> None:
    _move_content_type(apps, schema_editor, "agents", "webhooks")


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0009_web_instance"),
        ("contenttypes", "0002_remove_content_type_name"),
        # The table is webhooks' until this moves it (webhooks 0009 depends on this one).
        ("webhooks", "0008_move_states"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="OperatorAction",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("actor", models.CharField(max_length=150)),
                        ("action", models.CharField(max_length=64)),
                        ("target", models.JSONField(default=dict)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "db_table": "webhooks_operatoraction",
                        "ordering": ["-created_at"],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_type_to_agents, content_type_to_webhooks),
    ]
