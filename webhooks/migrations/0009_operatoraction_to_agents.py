"""`OperatorAction` leaves webhooks' state: agents 0010 took it (same table, no copy)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0008_move_states"),
        ("agents", "0010_operatoraction"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="OperatorAction")],
            database_operations=[],
        ),
    ]
